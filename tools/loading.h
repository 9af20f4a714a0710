/* loading.h — what ckpt load and ckpt serve share: the device --device names, and waiting for a
 * started load under a progress bar.
 * Contract: loading_parse_device sets o->device (and o->cuda_device for cuda:N) from "cpu",
 * "cuda", "cuda:N" or "auto" and returns 0, or -1 with o untouched for anything else (the
 * command says which values it takes). loading_finish waits for l, drawing the bar on a
 * terminal (progress.h); 0 once every byte is in, or -1 after one line "ckpt: ..." saying why
 * it failed or that a signal interrupted it; l stays the caller's to release.
 */
#ifndef CK_TOOLS_LOADING_H
#define CK_TOOLS_LOADING_H

#include "../loader/ckload.h"

int loading_parse_device(const char *s, ckl_options *o);
int loading_finish(ckl_load *l);

#endif
