/* fakecuda.h — the test-only side of the stand-in for the CUDA runtime (fakecuda.c): how a test
 * configures it and reads its accounting. Built as build/fakecuda/libcudart.so.13, the soname
 * libckload links against, and picked instead of the toolkit's by LD_LIBRARY_PATH (libckload's
 * path to the toolkit is a RUNPATH, which LD_LIBRARY_PATH overrides).
 *
 * Contract:
 *  - It implements the CUDA runtime functions libckload calls (their signatures are the
 *    toolkit's: fakecuda.c includes cuda_runtime_api.h), plus cudaMemcpy, cudaMemGetInfo and
 *    cudaGetDevice for the tests and the device bookkeeping, and nothing else. Of the driver,
 *    reached through cudaGetDriverEntryPointByVersion (or the deprecated
 *    cudaGetDriverEntryPoint) as libckload reaches it, only cuMemGetAddressRange (the
 *    allocation holding a device address of the current device).
 *  - IPC across processes: cudaIpcGetMemHandle (the base of a cudaMalloc'ed allocation only)
 *    names the allocation's memfd as /proc/PID/fd/FD with its device and inode;
 *    cudaIpcOpenMemHandle (flags cudaIpcMemLazyEnablePeerAccess, on the handle's own device:
 *    no peer access is modelled, cudaErrorInvalidDevice otherwise) opens and checks it and maps
 *    it, the whole memfd (its size, not the handle's word), as an allocation of the importer's
 *    (its copies see it, the host cannot touch it); a handle whose process or memfd is gone is
 *    cudaErrorInvalidResourceHandle, one of this very process cudaErrorDeviceUninitialized. cudaIpcCloseMemHandle unmaps it; cudaFree of it is
 *    a violation.
 *  - It is stricter than hardware (docs/TESTING.md says how); a misuse it can see without failing
 *    the call is counted as a "violation" and described on stderr.
 *  - Configuration: the environment variable FAKECUDA at load time, or fakecuda_configure(spec)
 *    later, a list of words separated by spaces or commas:
 *      devices=N             N devices (default 1)
 *      nodevice | nodriver   cudaErrorNoDevice / cudaErrorInsufficientDriver from every call
 *      capacity=BYTES        device memory per device, K/M/G suffixes (default 1G)
 *      delay=MIN-MAX         each queued operation waits MIN..MAX microseconds (default 0-200)
 *      seed=N                seeds those delays (default 1)
 *      fail=FUNC:N[:CODE]    the Nth call of FUNC fails with CODE (default: FUNC's usual one);
 *                            for the synchronize calls, whose errors are asynchronous ones,
 *                            the error is sticky
 *      sticky=FUNC:N         the Nth call of FUNC fails with cudaErrorIllegalAddress, and so
 *                            does every call after it (a lost context)
 *      fault=N               the Nth queued copy faults when it runs: the same sticky error,
 *                            reported by later calls, as an asynchronous error is
 *      stats=PATH            at exit, the counters below as "name value" lines to PATH
 *    fakecuda_configure resets the call counts, the sticky error and the counters that are not
 *    live state; it refuses (-1, the reason on stderr) a bad spec, or one changing the devices
 *    while anything is live.
 *  - fakecuda_stat(name): device_allocs, pinned_allocs, streams, events, ipc_imports (live now),
 *    device_bytes (now), peak_device_bytes, pageable_copies (async copies whose host side was
 *    not cudaHostAlloc'ed), max_in_flight (copies queued and not yet done, at most, across
 *    streams), copies (done), violations, current_device (the calling thread's); -1 for any
 *    other name.
 */
#ifndef FAKECUDA_H
#define FAKECUDA_H

int fakecuda_configure(const char *spec);
long long fakecuda_stat(const char *name);

#endif
