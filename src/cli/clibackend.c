#include "cli/clibackend.h"

#include <stdlib.h>
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
    const bool cuda = cli_backend_is_cuda(name);
    if (device >= 0 && !cuda) {
        if (name && !strcmp(name, "cpu"))
            return err_set(e, SMELT_ERR_INVALID, "--device %d is a CUDA device; --backend cpu takes none", device);
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        return err_set(e, SMELT_ERR_DEVICE, "--device %d: no CUDA device is visible%s%s%s (--backend cpu runs on the CPU)",
                       device, vis ? " (CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "", vis ? ")" : "");
    }
    if (device < 0) device = 0;
    if (cuda) {
#ifdef SMELT_HAVE_CUDA
        /* --device N indexes the devices CUDA_VISIBLE_DEVICES leaves visible */
        int n = cuda_device_count();
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        if (device < 0 || device >= n)
            return err_set(e, n ? SMELT_ERR_INVALID : SMELT_ERR_DEVICE,
                           "--device %d: %d CUDA device%s visible%s%s%s", device, n,
                           n == 1 ? " is" : "s are", vis ? " (CUDA_VISIBLE_DEVICES=" : "",
                           vis ? vis : "", vis ? ")" : "");
        return cuda_backend_new(out, device, e);
#else
        return err_set(e, SMELT_ERR_UNSUPPORTED,
                       "this smelt was built without CUDA (nvcc was not found at build time)");
#endif
    }
    return cpu_backend_new(out, threads, e);
}
