/* cudart.c — the CUDA runtime, found and opened at the first CUDA use (cudart.h). */
#include "cudart.h"

#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

cudart_api cudart;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char failure[256]; /* why the open failed, "" when it worked (set once, under once) */

/* The sonames of the majors whose API this uses, newest first. */
static const char *const SONAMES[] = {"libcudart.so.13", "libcudart.so.12"};

/* Each function of the table from so; 0, or -1 naming the first one missing. */
static int bind(void *so, const char *from)
{
#define SYM(f) ((*(void **)&cudart.f = dlsym(so, "cuda" #f)) ? 0 : (bad = "cuda" #f, -1))
    const char *bad = NULL;
    int rc = SYM(GetDeviceCount) || SYM(GetDevice) || SYM(SetDevice) || SYM(Malloc) ||
             SYM(Free) || SYM(HostAlloc) || SYM(FreeHost) || SYM(DeviceSynchronize) ||
             SYM(StreamCreateWithFlags) || SYM(StreamSynchronize) || SYM(StreamDestroy) ||
             SYM(EventCreateWithFlags) || SYM(EventRecord) || SYM(EventSynchronize) ||
             SYM(EventDestroy) || SYM(MemcpyAsync) || SYM(LaunchHostFunc) ||
             SYM(IpcGetMemHandle) || SYM(IpcOpenMemHandle) || SYM(IpcCloseMemHandle) ||
             SYM(GetLastError) || SYM(GetErrorString);
#undef SYM
    *(void **)&cudart.GetDriverEntryPointByVersion = dlsym(so, "cudaGetDriverEntryPointByVersion");
    *(void **)&cudart.GetDriverEntryPoint = dlsym(so, "cudaGetDriverEntryPoint");
    if (rc)
        snprintf(failure, sizeof failure, "%s has no %s", from, bad);
    return rc ? -1 : 0;
}

static void open_runtime(void)
{
    void *so = NULL;
    const char *from = NULL, *env = getenv("CKLOAD_CUDART");
    for (size_t i = 0; !so && i < sizeof SONAMES / sizeof *SONAMES; i++) /* torch's, say */
        so = dlopen(from = SONAMES[i], RTLD_NOW | RTLD_NOLOAD);
    if (!so && env && *env)
        so = dlopen(from = env, RTLD_NOW | RTLD_LOCAL);
    for (size_t i = 0; !so && !(env && *env) && i < sizeof SONAMES / sizeof *SONAMES; i++)
        so = dlopen(from = SONAMES[i], RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        snprintf(failure, sizeof failure, "no CUDA runtime: %s%s%s not found (CKLOAD_CUDART "
                 "may name a libcudart.so.12 or .13)", env && *env ? "CKLOAD_CUDART=" : "",
                 env && *env ? env : "none loaded, and libcudart.so.13 or .12",
                 env && *env ? "" : " on the library path");
        return;
    }
    if (bind(so, from) != 0)
        dlclose(so);
}

int cudart_open(char *why, size_t len)
{
    pthread_once(&once, open_runtime);
    if (!failure[0])
        return 0;
    snprintf(why, len, "%s", failure);
    return -1;
}

/* The driver function as CUDA 12.0 has it (cuMemGetAddressRange_v2, the one cuda.h names):
 * 12.0 is the oldest runtime this opens, so any driver under it knows that version. */
enum { ADDRESS_RANGE_AS_OF = 12000 };

int cudart_address_range(const void *p, uintptr_t *base, size_t *size, char *why, size_t len)
{
    CUresult (*range)(CUdeviceptr *, size_t *, CUdeviceptr) = NULL;
    enum cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e = cudaErrorNotSupported;
    if (cudart.GetDriverEntryPointByVersion)
        e = cudart.GetDriverEntryPointByVersion("cuMemGetAddressRange", (void **)&range,
                                                ADDRESS_RANGE_AS_OF, cudaEnableDefault, &found);
    else if (cudart.GetDriverEntryPoint)
        e = cudart.GetDriverEntryPoint("cuMemGetAddressRange", (void **)&range,
                                       cudaEnableDefault, &found);
    if (e != cudaSuccess || !range || found != cudaDriverEntryPointSuccess) {
        cudart.GetLastError();
        snprintf(why, len, "cannot ask the driver how large the mapping is (cuMemGetAddressRange "
                 "through cudaGetDriverEntryPoint: %s)",
                 e != cudaSuccess ? cudart.GetErrorString(e) : "not found");
        return -1;
    }
    CUdeviceptr b = 0;
    CUresult r = range(&b, size, (CUdeviceptr)(uintptr_t)p);
    if (r != CUDA_SUCCESS) {
        snprintf(why, len, "cannot ask the driver how large the mapping is "
                 "(cuMemGetAddressRange: CUresult %d)", (int)r);
        return -1;
    }
    *base = (uintptr_t)b;
    return 0;
}
