/* loadview.h — what the loader's other modules read of a load and make of one, beside the public
 * API (ckload.h): a load's block and plan, to serve it (share.h), and a load around tensors
 * already in device memory, an attachment. ckload.c owns both; nothing here calls back into
 * another module except through the function pointer it is given.
 *
 * Contract:
 *  - load_view fills *v once the load has landed (ckl_wait_all first): its block (device or
 *    host memory, block_size bytes), device and ordinal, plan (blobs and their places, tensors'
 *    blobs) and index (its source files as opened: path, device, inode, size, mtime). The
 *    load keeps all of it while it lives.
 *  - load_adopt makes a load of device memory it does not own: tensors (taken; names and
 *    shapes the caller's, kept until drop), plan (taken: blobs with their places in block,
 *    tensors' blobs, blob_tensors), every blob landed. ckl_read_path says "attach". Its last
 *    release calls drop(ctx) instead of freeing a block: whoever mapped the memory unmaps it.
 *    The load is an ordinary one for every ckl_ call; nothing is read.
 */
#ifndef CKL_LOADVIEW_H
#define CKL_LOADVIEW_H

#include <stdint.h>

#include "plan.h"

/* ckload.h's load and tensor, by their struct tags: ckload.c implements this header and
 * includes it, so it includes no header of the API. */
struct ckl_load;
struct ckl_tensor;

typedef struct load_view {
    const unsigned char *block;
    uint64_t block_size;
    int device, ordinal;
    const ck_plan *plan;
    const ck_index *ix;
    const char *path;        /* as shown in messages */
} load_view;

void load_view_of(const struct ckl_load *l, load_view *v);

typedef struct load_adopted {
    const char *shown;       /* what messages call it (copied) */
    int ordinal;             /* the CUDA device the memory is on */
    unsigned char *block;
    ck_plan *plan;           /* taken */
    struct ckl_tensor *tensors; /* taken, plan->ntensors; data set here */
    void (*drop)(void *ctx);
    void *ctx;
} load_adopted;

/* 0 with *out set; -1 with err set ("SHOWN: out of memory") and errno ENOMEM: then nothing is
 * taken (the caller still owns plan and tensors) and drop is not called. */
int load_adopt(const load_adopted *a, struct ckl_load **out, char *err, size_t errlen);

#endif
