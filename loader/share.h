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
 *    from a URL (no identity to re-check) is refused. The socket is created (a stale one, that
 *    no server answers, is replaced; a live one is refused) with mode 0666: the server, not the
 *    file's mode, decides who attaches, so that a refused client hears why.
 *  - Each connection: the peer's credentials (SO_PEERCRED, SO_PEERGROUPS) must be the server's
 *    uid, or carry the group given; the source files must still be those loaded (stat, the
 *    identity above). Else the client gets a refusal, one line, and the connection closes.
 *    Else it gets the table, and the connection stays open: it IS the attachment. The server
 *    counts open connections (ckl_server_attached); one that closes, however its process ended,
 *    no longer counts.
 *  - ckl_server_close refuses (EBUSY) while attachments live, unless forced; then, or forced,
 *    it stops the thread, closes every connection, removes the socket and drops the server's
 *    reference on the load (the block is freed with the load's last reference).
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
 *    EACCES (refused: not the server's uid or group; or a server the client does not trust),
 *    EINVAL (another device, a bad argument), ENODEV (no CUDA, or a host load), EBUSY (close
 *    while attached), EIO (changed source, a message refused, a table beyond the mapping, the
 *    deadline, anything else).
 */
#ifndef CKL_SHARE_H
#define CKL_SHARE_H

#include "ckload.h"

/* Seconds a client gives the whole exchange (connect and message: CKLOAD_ATTACH_WAIT may say
 * otherwise), and a server a client to take its table, before giving up on it: a stalled peer
 * never hangs the other. */
#define SHARE_WAIT_S 30

#endif
