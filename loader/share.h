/* share.h — warm attach: a load on a CUDA device served to other processes of this machine over
 * a Unix socket, and attached to by them (CUDA IPC), so that a restarting process has its
 * tensors in milliseconds rather than loading again. The ckl_serve / ckl_attach API of ckload.h;
 * the message is sharemsg.h's; the device memory is the backend's (backend.h: share, attach,
 * detach, the CUDA runtime's cudaIpc*MemHandle).
 *
 * Contract:
 *  - ckl_serve(l, SOCKET) waits for l to land, exports its block (cudaIpcGetMemHandle), writes
 *    the table once (the handle, the device, the blobs and tensors, the served location as an
 *    absolute path and each of its source files' identity: device, inode, size, mtime, as the
 *    load opened them) and serves it from a thread of its own until closed. A load in host
 *    memory, one with tensors placed in the caller's memory (ckl_options.dest), or one read
 *    from a URL (no identity to re-check) is refused.
 *  - The socket. Its directory must be the server's euid's or root's, and writable by no one
 *    else unless sticky (EACCES): anyone who may rename names there could swap the socket for
 *    a link to a file (that a mode change would follow) or for a socket of their own. It is
 *    bound in a fresh 0700 directory made there (through the directory's open descriptor, so
 *    that no path another user can change is followed), given mode 0666 there, and renamed to
 *    its name without replacing anything (renameat2 RENAME_NOREPLACE): a file, a symlink, a
 *    directory, another uid's socket or a live server's stays, and the serve is refused
 *    (EINVAL, one line saying which); only a socket of the server's euid that no server
 *    answers is removed first. Mode 0666: the server, not the file's mode, decides who
 *    attaches, so that a refused client hears why. ckl_server_close removes the name only
 *    while it is still the socket made. ckl_default_socket (sharesock.h) is the path when
 *    none is given.
 *  - Each connection: the peer's credentials (SO_PEERCRED, SO_PEERGROUPS) must be the server's
 *    uid, or carry the group given; the source files must still be those loaded (stat, the
 *    identity above). Else the client gets a refusal, one line, and the connection closes.
 *    Else it gets the table, and the connection stays open: it IS the attachment. Nothing the
 *    client sends is read but its end, and nothing of it reaches a message. The server counts
 *    an attachment from the table's first byte (ckl_server_attached) until its connection
 *    closes, however its process ended: a client never holds a table the server did not
 *    count.
 *  - Every connection at its own pace: one thread polls them all, sends never wait (each
 *    answer goes out as its socket takes it), and each answer has a whole deadline
 *    (share_wait_s from its accept): a client that reads slowly or not at all loses only its
 *    own exchange. At most SHARE_MAX_EXCHANGES answers are under way and SHARE_BACKLOG
 *    connections wait in the kernel; out of descriptors (EMFILE, ENFILE) the server stops
 *    accepting for a moment, or until a connection closes, rather than spin. Attachments are
 *    bounded by the descriptors only.
 *  - ckl_server_close refuses (EBUSY) while attachments live, unless forced, deciding under the
 *    lock that counts them, so no table starts after it decided; then, or forced, it stops the
 *    thread, closes every connection, removes the socket and drops the server's reference on
 *    the load (the block is freed with the load's last reference).
 *  - ckl_attach(SOCKET) connects and, before it reads a byte, checks who serves there
 *    (SO_PEERCRED of the listening process): this process's effective uid, root, or the group
 *    the caller names (gid: primary or supplementary, SO_PEERGROUPS); another is refused
 *    (EACCES). It reads the message (at most SHARE_MAX_MESSAGE bytes; the connect and the whole
 *    message within one deadline, CKLOAD_ATTACH_WAIT seconds, else SHARE_WAIT_S, however the
 *    server sends), parses it with every bound checked (no tensor name twice), refuses a block
 *    on another device than the one asked for, and, given the source it expects, one whose
 *    served location is another path or whose files are no longer those the server loaded
 *    ("changed source"). Any text of the server's (a refusal, a path) reaches the error with
 *    each control byte shown as '?'. It maps the block on its device (cudaIpcOpenMemHandle),
 *    asks the driver how large the mapped allocation is (cuMemGetAddressRange) and refuses a
 *    table whose block does not fit in it (EIO). It returns an ordinary load (ckl_read_path
 *    "attach"): ckl_get, ckl_find, ckl_to_dlpack(_versioned) work unchanged. share_client.h
 *    is the exchange up to the mapping (no CUDA), share_attach.c the mapping and the load.
 *    Its last release (the caller's and every DLPack export's) unmaps the block
 *    (cudaIpcCloseMemHandle) and closes the connection.
 *  - Lifetimes. The CUDA runtime says that freeing an exported allocation before its importers
 *    closed their mappings is undefined behaviour (cudaIpcOpenMemHandle's documentation), and
 *    promises nothing about what an importer reads once the exporter's process is gone. So
 *    ckload keeps the exporter alive instead: the server refuses to close while any
 *    connection is open, and `ckpt serve` keeps serving on a signal while attached. A client
 *    that crashes loses only its own connection; the others are unaffected. A killed server
 *    is seen at the next attach as an error ("no server is serving there": connect fails), never
 *    as a block; a client already attached when its server is killed holds tensors whose memory
 *    the driver may have torn down: the one case ckload cannot guard, which is why the server
 *    refuses to end first.
 *  - Errors are one line "SOCKET: what is wrong", errno as ckload.h says: ENOENT (no server),
 *    EACCES (refused: not the server's uid or group; a socket directory others may write; a
 *    server the client does not trust), EINVAL (another device, a bad argument, something at
 *    the socket's path that stays), ENODEV (no CUDA, or a host load), EBUSY (close while
 *    attached), EIO (changed source, a message refused, a table beyond the mapping, the
 *    deadline, anything else).
 */
#ifndef CKL_SHARE_H
#define CKL_SHARE_H

#include "ckload.h"

/* Seconds one exchange may take in all: a client's connect and message (CKLOAD_ATTACH_WAIT may
 * say otherwise), a server's whole answer to a client (CKLOAD_SHARE_WAIT), before giving up on
 * it: a stalled peer never hangs the other. Both read through share_wait_s (sharesock.h). */
#define SHARE_WAIT_S 30

#endif
