/* dlpack_v1.h — dlpack.h, and DLPack 1.0's versioned managed tensor where that dlpack.h is older
 * (Debian 12 has 0.6): the struct as the DLPack 1.0 specification lays it out, the same one a
 * 1.0 header declares, so that libckload exports versioned capsules whichever it was built with.
 */
#ifndef CKL_DLPACK_V1_H
#define CKL_DLPACK_V1_H

#include <dlpack/dlpack.h>
#include <stdint.h>

#ifndef DLPACK_MAJOR_VERSION /* dlpack.h before 1.0 */
typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;
#endif

#endif
