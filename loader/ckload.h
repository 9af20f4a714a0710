/* ckload.h — libckload: stream a checkpoint (any source ckptfs mounts) into device or host memory.
 *
 * Build against it with `pkg-config --cflags --libs ckload` once `make install` has run; only the
 * ckl_ functions below are exported. ckl_to_dlpack's result is dlpack.h's DLManagedTensor
 * (libdlpack-dev, DLPack 0.6 or later), a header the caller includes itself.
 *
 * Contract:
 *  - ckl_load opens any source ckptfs mounts — a pack (a file, or a mount's
 *    .ckptfs/checkpoint.pack), a safetensors file, a directory of shards, a PyTorch zip or
 *    legacy file — with no conversion: every source is laid out as its pack would be (as
 *    `ckpt pack` writes it), natural name order, tied tensors loaded once and shared, values
 *    left out, strided PyTorch tensors gathered chunk by chunk on the way (into the staging
 *    buffer for CUDA, into the block for the host). It allocates one destination block for the selected
 *    tensors (device memory for CUDA, page-aligned host memory for the CPU) and starts reader
 *    threads at once; it returns before the data is in. Tensors are views into the block:
 *    name, dtype, shape, pointer. ckl_read_path tells where the bytes are read from. Each
 *    tensor's pointer is 256-byte aligned, except where a host load reads a source O_DIRECT
 *    straight into the block: there a tensor takes its file offset's phase (as an mmap of the
 *    file would place it) and is aligned at least to its
 *    element (to 256 bytes where its file offset is: every tensor of a pack).
 *  - A path inside a ckptfs mount (its root, .ckptfs/checkpoint.pack, a directory: the tensors
 *    under it, a tensor file: that tensor) is read from the mount's source files directly, with
 *    the caller's own credentials, when they are visible, readable and the very files the mount
 *    parsed (device, inode, size, mtime); else, or with CKLOAD_BYPASS=0, through the mount's
 *    .ckptfs/checkpoint.pack with the same selection. A source file changed
 *    after mounting is never read as if it were the old one: the bypass checks each file after
 *    reading from it, and the mount checks its sources on every read.
 *  - verify: a pack stores an XXH3 per blob, checked as its bytes stream. Other sources store
 *    no checksums: there verify checks only that each source file is still the file opened,
 *    unchanged (device, inode, size, mtime) once a tensor's bytes are read from it: every file
 *    they come from (a DCP tensor's chunks' files), not only the one its entry names.
 *  - Open files: the load's index holds a descriptor per source file while it lives. Where
 *    opening one meets the soft limit of open files (EMFILE: a DCP job of more than 1,024
 *    ranks' files), the soft limit is raised to the hard one, once, and never lowered; nothing
 *    is changed for a load that fits (docs/SEMANTICS.md, limits).
 *  - CUDA pipeline: each reader thread owns a CUDA stream and `buffers` pinned staging buffers
 *    from the pool (cudaHostAlloc), used round-robin: pread into one while the others'
 *    cudaMemcpyAsync run; a buffer is refilled only after its event completes. Threads take
 *    tensors in pack order (natural name order), so early layers arrive first.
 *    CPU pipeline: reader threads pread straight into the destination (no staging needed).
 *  - Readiness: ckl_wait(l, i) blocks until tensor i is in place; the on_ready callback runs
 *    (on a loader thread, never inside a CUDA host function: it may call CUDA) as each tensor
 *    lands, for empty tensors as soon as the load starts.
 *    ckl_wait_all waits for everything.
 *  - Errors (no driver or device, out of memory, truncated or corrupt pack, checksum mismatch
 *    with verify) are reported as one line "FILE: what is wrong", FILE as the caller spelled it,
 *    however long; the program that prints it puts its own name in front ("ckpt: ", "ckload: ").
 *    With its NUL it fits in strlen(path) + 512 bytes. A message names an option as the caller
 *    spells it (ckl_options.spelling: "--only" for ckpt's flags, "only=" for Python's
 *    parameters). Every function that fails with err set also sets errno to the error's class:
 *    ENOENT (the source path does not exist), EACCES (it exists but cannot be opened for
 *    reading), EINVAL (an argument is refused: an option out of its bounds, `only` that selects
 *    nothing, a slice rule that cannot cut a tensor it selects, no such share, tensor or blob),
 *    ENODEV (no CUDA runtime, driver or device), ENOMEM (out of host or device memory),
 *    ECANCELED (ckl_options.dest refused the load), EIO (anything else: a source that is not a
 *    checkpoint or is corrupt, a failed read, a checksum mismatch, a file changed while read,
 *    another process's error). After any error no tensor is handed out (ckl_wait fails) and
 *    ckl_release frees everything.
 *  - A load is reference counted: ckl_release drops the caller's reference; each DLPack export
 *    holds one more, so device memory is freed when the last exported tensor is deleted.
 *  - Into the caller's memory (ckl_options.dest): asked once per selected tensor, before any
 *    byte is read, the caller places it at an address of its own (t->nbytes bytes on the load's
 *    device: host memory for a host load, device memory of cuda_device for CUDA, valid and not
 *    otherwise written until the load is released), leaves it to the load's block, or skips it
 *    (it is left out of the load, as `only` leaves tensors out). A blob (tied tensors share one)
 *    is read once, into its first placed tensor's address; each other tensor of it placed
 *    elsewhere gets a copy of those bytes before the blob counts as landed. ckl_get(l, i)->data
 *    is where tensor i is; the block holds only what was left to it. Placements that overlap
 *    are refused (EINVAL, naming two tensors), except tensors of one blob at one address: the
 *    bytes of different blobs are written by different threads.
 *  - Once its readers are done (every blob read here is in, or the load failed) a load closes
 *    its source files: a mount it read can be unmounted while its tensors live. What it keeps
 *    is the block, the tensors' names and shapes, and the DLPack exports' references.
 *  - Pools of pinned buffers outlive loads: pass the same ckl_pool to many loads.
 *  - Many processes (ranks) loading one checkpoint: slice rules load each rank's part of the
 *    tensors they cut, read straight from the source; a read share (read) has
 *    this process read only its blobs and its caller bring in the others (ckl_blob_put), each
 *    tensor ready, as ever, once its blob has landed (the Python module's load_distributed).
 *  - ABI: CKL_ABI_VERSION changes (with the library's soname, libckload.so.N) whenever a struct
 *    or a signature below does. A binding that mirrors the structs by hand checks them against
 *    ckl_abi_version and ckl_layout when it loads the library.
 */
#ifndef CKLOAD_H
#define CKLOAD_H

#include <stddef.h>
#include <stdint.h>

#define CKL_ABI_VERSION 5

enum ckl_device { CKL_CPU = 0, CKL_CUDA = 1, CKL_AUTO = 2 };

/* Who reads which bytes when world_size processes load one checkpoint together (ckl_options.read;
 * the plan's read share): each everything; each whole blob by one rank, balanced by size
 * (each part by its own rank); everything by rank 0. The bytes a process does not read come from
 * its caller (ckl_blob_put), e.g. a torch.distributed broadcast from the rank that read them.
 * CKL_READ_PARTS loads only the parts the slice rules cut for `rank`, all read here: what rank 0
 * reads for another rank under CKL_READ_RANK0, to send it. */
enum ckl_read { CKL_READ_ALL = 0, CKL_READ_BALANCED = 1, CKL_READ_RANK0 = 2, CKL_READ_PARTS = 3 };

/* A slice rule: tensors whose name glob selects (a prefix or glob, as `only`) are cut along dim
 * into world_size parts as torch.chunk cuts them, and this process loads part `rank`; dim -1:
 * whole (replicated). The first rule that selects a name decides. */
typedef struct ckl_slice {
    const char *glob;
    int dim;
} ckl_slice;

typedef struct ckl_pool ckl_pool;
typedef struct ckl_load ckl_load;
struct ckl_tensor;

/* What ckl_options.dest answers for a tensor: left to the load's block; placed at *at; left out
 * of the load. Any other answer fails the load at start ("tensor 'NAME': refused by the
 * caller"). */
enum ckl_dest { CKL_DEST_BLOCK = 0, CKL_DEST_AT = 1, CKL_DEST_SKIP = 2 };

/* How messages name an option (ckl_options.spelling): as ckpt's flags ("--only 'x'", the
 * default), or as the Python module's parameters ("only='x'"). */
enum ckl_spelling { CKL_SPELL_FLAGS = 0, CKL_SPELL_PARAMS = 1 };

/* The options' bounds: a load given a value outside them fails at start, naming the option. */
#define CKL_MAX_THREADS 256u              /* threads */
#define CKL_MIN_BUFFER_SIZE 4096u         /* buffer_size, when not 0 */
#define CKL_MAX_BUFFER_SIZE (1ull << 32)
#define CKL_MAX_BUFFERS 64u               /* buffers */
#define CKL_MAX_WORLD_SIZE (1u << 20)     /* world_size (and so rank, below it) */
#define CKL_MAX_SLICE_DIM 63              /* a slice rule's dim: -1 (whole) up to this */

typedef struct ckl_options {
    int device;              /* enum ckl_device */
    int cuda_device;         /* ordinal, for CKL_CUDA / CKL_AUTO */
    unsigned threads;        /* reader threads; 0: chosen per load (8 for CUDA and for a
                              * host load mostly read O_DIRECT out of phase, else 4) */
    size_t buffer_size;      /* bytes per staging buffer and per read; 0: chosen per load
                              * (4 MiB where threads would be 8, else 16 MiB) */
    unsigned buffers;        /* pinned staging buffers per reader thread (CUDA); 0: default (2) */
    const char *only;        /* NULL, or a prefix / glob over names (as ckpt pack --only) */
    int verify;              /* a pack: check every blob's XXH3 as its bytes stream; other
                              * sources: check each file is unchanged after its reads */
    void (*on_ready)(void *ctx, size_t tensor); /* may be NULL */
    void *ctx;
    ckl_pool *pool;          /* NULL: a pool private to this load */
    const ckl_slice *slices; /* NULL, or nslices rules: each tensor they cut is loaded as this
                              * rank's part, read straight from the source (its shape is the
                              * part's; a part of a pack blob has no stored checksum: verify
                              * checks its file is unchanged, as for other sources) */
    size_t nslices;
    unsigned rank;           /* this process's part and share, of world_size */
    unsigned world_size;     /* 0 or 1: alone */
    int read;                /* enum ckl_read: the blobs this process reads itself */
    /* NULL, or where each selected tensor goes (see the contract): called with ctx on the thread
     * of ckl_load_start, once per tensor in pack order, t as ckl_get will show it (its data
     * not yet set; a sliced tensor's part); returns enum ckl_dest, *at set for CKL_DEST_AT.
     * Then once more with t and at NULL: any answer but CKL_DEST_BLOCK fails the load ("the
     * load was refused by its caller") before a byte is read. */
    int (*dest)(void *ctx, const struct ckl_tensor *t, void **at);
    int spelling;            /* enum ckl_spelling: how messages name an option */
} ckl_options;

typedef struct ckl_tensor {
    const char *name;
    const char *dtype;       /* safetensors spelling: "F32", "BF16", ... */
    const int64_t *shape;
    void *data;              /* device or host pointer into the load's block */
    uint64_t nbytes;
    uint8_t rank;
    uint8_t dtype_code;      /* enum ck_dtype */
} ckl_tensor;

/* CKL_ABI_VERSION as this library was built. */
unsigned ckl_abi_version(void);
/* The layout of the structs a binding mirrors, as this library was built: ckl_layout("ckl_tensor")
 * is its size, ckl_layout("ckl_tensor.rank") the offset of that field; likewise for ckl_options
 * and dlpack.h's DLDevice, DLDataType, DLTensor, DLManagedTensor, DLPackVersion and
 * DLManagedTensorVersioned; and the options' bounds above by their names
 * (ckl_layout("CKL_MAX_THREADS")). -1 for any other name. */
long ckl_layout(const char *what);

/* Fills *o with the defaults. */
void ckl_default_options(ckl_options *o);

/* Starts loading path. 0 on success; -1 with err (errlen bytes) and errno set, nothing
 * allocated. */
int ckl_load_start(const char *path, const ckl_options *o, ckl_load **out, char *err,
                   size_t errlen);

size_t ckl_count(const ckl_load *l);
const ckl_tensor *ckl_get(const ckl_load *l, size_t i);
/* The index of tensor name, or -1. */
long ckl_find(const ckl_load *l, const char *name);
/* CKL_CPU or CKL_CUDA: where the block is. */
int ckl_device_of(const ckl_load *l);
int ckl_cuda_ordinal(const ckl_load *l);
uint64_t ckl_total_bytes(const ckl_load *l);
/* Bytes this process has read into place so far (for progress; with a read share, its share). */
uint64_t ckl_done_bytes(const ckl_load *l);
/* Where the bytes are read from, a static string: "pack" (a pack file, whose checksums verify
 * checks), "source" (a safetensors or PyTorch file or a shard directory, read in place),
 * "bypass" (a path inside a ckptfs mount, read from the mount's source files directly) or
 * "mount" (a path inside a mount, read through it: the bypass was refused or CKLOAD_BYPASS=0), or
 * "attach" (nothing read: another process's block, mapped: ckl_attach). */
const char *ckl_read_path(const ckl_load *l);

/* What identifies the source files l opened, as they were when it opened them: a hash of each
 * one's name and identity (device, inode, size, mtime; a remote object's size and
 * Last-Modified), never 0, that two loads of one location share while its files are the same
 * (a file replaced, rewritten or touched between them changes it); 0 for an attached load. What
 * a caller running several loads of one source compares (the Python module's stream, at every
 * window). */
uint64_t ckl_source_identity(const ckl_load *l);

/* Waits for tensor i / for everything. 0, or -1 with the load's error in err (errno EIO; EINVAL
 * for no tensor i). */
int ckl_wait(ckl_load *l, size_t i, char *err, size_t errlen);
int ckl_wait_all(ckl_load *l, char *err, size_t errlen);
/* As ckl_wait_all, but returns 1 if the load is still going after ms milliseconds (0: forever). */
int ckl_wait_all_for(ckl_load *l, unsigned ms, char *err, size_t errlen);

/* Drops a reference; the last one waits for the readers and frees everything. */
void ckl_release(ckl_load *l);
void ckl_retain(ckl_load *l);

/* A load's blobs (the units it reads; tied tensors share one), in pack order, for a caller that
 * brings in those it does not read (read, above). ckl_blob: blob b's place in the block and
 * length, the rank that reads it (owner; -1: every rank reads its own part), whether it is a
 * part (sliced); 0, or -1 when there is no blob b. ckl_blob_wait waits for blob b as ckl_wait
 * does. ckl_blob_put says the caller has written blob b, one this process does not read, into its
 * place: it has landed, and its tensors are ready (on_ready runs, on the caller's thread). 0, or
 * -1 with err set (b is read here, or out of range, or the load failed). ckl_fail fails the load
 * with message msg, as is (another process's error): waits fail with it, nothing is handed out. */
size_t ckl_blob_count(const ckl_load *l);
int ckl_blob(const ckl_load *l, size_t b, void **data, uint64_t *nbytes, int *owner,
             int *sliced);
int ckl_blob_wait(ckl_load *l, size_t b, char *err, size_t errlen);
int ckl_blob_put(ckl_load *l, size_t b, char *err, size_t errlen);
void ckl_fail(ckl_load *l, const char *msg);

/* Pinned staging buffers kept across loads (CUDA only; harmless for the CPU). */
ckl_pool *ckl_pool_new(void);
void ckl_pool_free(ckl_pool *p);

/* Whether only (a prefix or glob, as ckl_options.only) selects name; NULL selects every name. */
int ckl_selected(const char *only, const char *name);

/* location as libckload's messages show it: a URL without its secrets (userinfo, query) in buf
 * (cap bytes, truncated to fit), returned; anything else as it is. */
const char *ckl_location_shown(const char *location, char *buf, size_t cap);

/* Whether this build has CUDA, and whether a device is usable now. */
int ckl_cuda_built(void);
int ckl_cuda_available(void);

/* Tensor i as a DLPack DLManagedTensor (dlpack.h), holding a reference on the load; returns
 * NULL if the load failed or is not complete for that tensor. */
struct DLManagedTensor;
struct DLManagedTensor *ckl_to_dlpack(ckl_load *l, size_t i);
/* The same as a DLPack 1.0 DLManagedTensorVersioned (version 1.0, the flags given: 0, or
 * CKL_DLPACK_READ_ONLY for bytes its consumer must not write), for consumers that ask for one
 * (__dlpack__(max_version=(1, 0))); its struct is in a dlpack.h of 1.0 or later, which the
 * caller includes (libckload itself builds with 0.6's and lays it out as 1.0 says). NULL as
 * ckl_to_dlpack, or for flags other than those. */
#define CKL_DLPACK_READ_ONLY 1ull /* DLPACK_FLAG_BITMASK_READ_ONLY */
struct DLManagedTensorVersioned;
struct DLManagedTensorVersioned *ckl_to_dlpack_versioned(ckl_load *l, size_t i, uint64_t flags);

/* Warm attach (share.h says the whole contract): a load on a CUDA device served to the other
 * processes of this machine over the Unix socket socket_path, and mapped by them (CUDA IPC)
 * rather than loaded again.
 * ckl_serve waits for l to land, then serves it from a thread of its own, holding a reference
 * on l: a client is admitted if its uid is the server's or it is in group gid (-1: none), and
 * while the files l was read from are still those it read. The socket's directory must be one
 * no other user can swap names in (EACCES); nothing but a stale socket of this user's is
 * replaced (EINVAL). 0, or -1 with err and errno set.
 * ckl_server_attached: the attachments live now (one per client given the table, from its
 * first byte until its connection closes, however its process ends). ckl_server_close: stops
 * serving and removes the socket; refused (EBUSY) while attachments live unless force.
 * ckl_default_socket: the socket path to use when none is given, into buf (len bytes):
 * $XDG_RUNTIME_DIR/ckload.sock, else $TMPDIR/ckload-UID/ckload.sock in a directory of this
 * user's alone (made if missing). 0, or -1 with err and errno set. */
typedef struct ckl_server ckl_server;
int ckl_serve(ckl_load *l, const char *socket_path, long gid, ckl_server **out, char *err,
              size_t errlen);
unsigned ckl_server_attached(ckl_server *s);
int ckl_server_close(ckl_server *s, int force, char *err, size_t errlen);
int ckl_default_socket(char *buf, size_t len, char *err, size_t errlen);
/* Attaches to the load served at socket_path: an ordinary load (ckl_read_path "attach") whose
 * tensors are the server's block mapped on this process's device cuda_device (-1: whichever the
 * block is on; another is refused, EINVAL). The server is trusted if it runs as this
 * process's uid, as root, or in group gid (-1: none); another is refused (EACCES) before a byte
 * of its table is read. source: NULL, or the location the caller expects the server to have
 * loaded: another, or one whose files changed since, is refused ("changed source", EIO). A
 * table that claims more than the mapping the driver made holds is refused (EIO). The whole
 * exchange ends within CKLOAD_ATTACH_WAIT seconds (default 30), however slowly the server
 * answers (EIO). No server: ENOENT; refused by it: EACCES. The last release unmaps the block
 * and closes the connection (the attachment). */
int ckl_attach(const char *socket_path, int cuda_device, const char *source, long gid,
               ckl_load **out, char *err, size_t errlen);

#endif
