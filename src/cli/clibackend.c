#include "cli/clibackend.h"

#include <string.h>

#ifdef SMELT_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

bool cli_backend_is_cuda(const char *name) {
    if (!name || !strcmp(name, "auto")) {
#ifdef SMELT_HAVE_CUDA
        return cuda_device_count() > 0;
#else
        return false;
#endif
    }
    return !strcmp(name, "cuda");
}

smelt_status cli_backend_new(const char *name, int device, int threads, struct backend **out,
                             struct err *e) {
    *out = NULL;
    if (name && strcmp(name, "auto") && strcmp(name, "cpu") && strcmp(name, "cuda"))
        return err_set(e, SMELT_ERR_INVALID, "unknown backend '%s' (auto, cpu, cuda)", name);
    if (cli_backend_is_cuda(name)) {
#ifdef SMELT_HAVE_CUDA
        return cuda_backend_new(out, device, e);
#else
        return err_set(e, SMELT_ERR_UNSUPPORTED,
                       "this smelt was built without CUDA (nvcc was not found at build time)");
#endif
    }
    return cpu_backend_new(out, threads, e);
}
