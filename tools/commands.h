/* commands.h — ckpt commands defined outside ckpt.c. Contract: each is run with argv[0] its name
 * and returns the exit status; its usage line and help text fill its entry in ckpt.c's table. */
#ifndef CK_TOOLS_COMMANDS_H
#define CK_TOOLS_COMMANDS_H

int cmd_convert(int argc, char **argv); extern const char convert_usage[], convert_help[];

#endif
