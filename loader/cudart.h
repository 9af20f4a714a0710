/* cudart.h — the CUDA runtime, opened at the first CUDA use rather than linked: ckpt, ckptfs
 * and libckload start, and load to the host, on a machine with no CUDA at all.
 *
 * Contract:
 *  - cudart_open finds libcudart once per process, in this order: a copy already loaded (the
 *    one torch brought: its wheels ship libcudart.so.12 or .13 in site-packages, found by
 *    soname with RTLD_NOLOAD), then the file CKLOAD_CUDART names, then the system's
 *    libcudart.so.13 and libcudart.so.12 (the majors whose API this uses). The runtime API,
 *    not the driver's: it is what torch and the stand-in (tests/fakecuda) speak, and a copy
 *    torch loaded shares torch's context.
 *  - Where none is found (or one lacks a function), it fails with one line naming what was
 *    looked for and CKLOAD_CUDART; nothing is retried later in the process.
 *  - After a successful open, `cudart` holds the functions, never changed again.
 *  - cudart_address_range asks the driver, through the runtime's documented door to it
 *    (cudaGetDriverEntryPointByVersion from CUDA 12.5, cudaGetDriverEntryPoint before), for
 *    cuMemGetAddressRange: the allocation that holds a device address, an imported one too.
 *    A runtime with neither, or a driver without it, is an error, never a guess.
 */
#ifndef CKL_CUDART_H
#define CKL_CUDART_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

typedef struct cudart_api {
    cudaError_t (*GetDeviceCount)(int *);
    cudaError_t (*GetDevice)(int *);
    cudaError_t (*SetDevice)(int);
    cudaError_t (*Malloc)(void **, size_t);
    cudaError_t (*Free)(void *);
    cudaError_t (*HostAlloc)(void **, size_t, unsigned int);
    cudaError_t (*FreeHost)(void *);
    cudaError_t (*DeviceSynchronize)(void);
    cudaError_t (*StreamCreateWithFlags)(cudaStream_t *, unsigned int);
    cudaError_t (*StreamSynchronize)(cudaStream_t);
    cudaError_t (*StreamDestroy)(cudaStream_t);
    cudaError_t (*EventCreateWithFlags)(cudaEvent_t *, unsigned int);
    cudaError_t (*EventRecord)(cudaEvent_t, cudaStream_t);
    cudaError_t (*EventSynchronize)(cudaEvent_t);
    cudaError_t (*EventDestroy)(cudaEvent_t);
    cudaError_t (*MemcpyAsync)(void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t);
    cudaError_t (*LaunchHostFunc)(cudaStream_t, cudaHostFn_t, void *);
    cudaError_t (*IpcGetMemHandle)(cudaIpcMemHandle_t *, void *);
    cudaError_t (*IpcOpenMemHandle)(void **, cudaIpcMemHandle_t, unsigned int);
    cudaError_t (*IpcCloseMemHandle)(void *);
    cudaError_t (*GetLastError)(void);
    const char *(*GetErrorString)(cudaError_t);
    /* Either may be NULL: the first is CUDA 12.5's, the second deprecated since. */
    cudaError_t (*GetDriverEntryPointByVersion)(const char *, void **, unsigned int,
                                                unsigned long long,
                                                enum cudaDriverEntryPointQueryResult *);
    cudaError_t (*GetDriverEntryPoint)(const char *, void **, unsigned long long,
                                       enum cudaDriverEntryPointQueryResult *);
} cudart_api;

extern cudart_api cudart;

/* Opens the runtime (see the contract). 0, or -1 with why (len bytes) set. */
int cudart_open(char *why, size_t len);

/* The base and size of the device allocation holding p (cuMemGetAddressRange, on the calling
 * thread's current device): 0, or -1 with why set. After a successful cudart_open. */
int cudart_address_range(const void *p, uintptr_t *base, size_t *size, char *why, size_t len);

#endif
