/* backend_nocuda.c — takes backend_cuda.c's place where libckload is built without the CUDA
 * toolkit: there is no CUDA backend, and the core says so ("built without CUDA"). */
#include "backend.h"

const backend *const backend_cuda = NULL;
