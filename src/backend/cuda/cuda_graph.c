/* The CUDA backend's step graphs: a decode step's ops, keyed by the step's shape
 * (model_forward's key), run eagerly the first time (the scratch grows to its size), are
 * captured the second time (cudaStreamBeginCapture, relaxed) and replayed after that. An
 * entry per key, the least recently used one recycled; growing the scratch drops them all
 * (cuda_mem.c). SMELT_NO_GRAPH=1 turns graphs off. */
#include "backend/cuda/cuda_backend_int.h"

#include <string.h>

/* ---- step graphs ---- */

void cu_graphs_clear(struct cuda_backend *cb) {
    for (int i = 0; i < CUDA_GRAPHS; i++) {
        if (cb->graphs[i].exec) cudaGraphExecDestroy(cb->graphs[i].exec);
        memset(&cb->graphs[i], 0, sizeof cb->graphs[i]);
    }
}

static struct graph_ent *graph_find(struct cuda_backend *cb, uint64_t key) {
    for (int i = 0; i < CUDA_GRAPHS; i++)
        if (cb->graphs[i].seen && cb->graphs[i].key == key) return &cb->graphs[i];
    return NULL;
}

bool cu_graph_replay(struct backend *b, uint64_t key) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb) || cb->no_graph) return false;
    struct graph_ent *g = graph_find(cb, key);
    if (!g || !g->exec) return false;
    g->last_use = ++cb->clock;
    cudaError_t rc = cudaGraphLaunch(g->exec, cb->ctx.stream);
    if (rc != cudaSuccess) {
        CU_FAIL(cb, rc, "graph launch");
        return true; /* the step failed; the sticky error reports it */
    }
    return true;
}

void cu_graph_begin(struct backend *b, uint64_t key) {
    struct cuda_backend *cb = cu_enter(b);
    cb->capturing = -1;
    if (cb->no_graph || !cu_ok(cb)) return;
    struct graph_ent *g = graph_find(cb, key);
    if (!g) { /* a new shape: take a free or the least recently used entry */
        g = &cb->graphs[0];
        for (int i = 0; i < CUDA_GRAPHS; i++) {
            if (!cb->graphs[i].seen) {
                g = &cb->graphs[i];
                break;
            }
            if (cb->graphs[i].last_use < g->last_use) g = &cb->graphs[i];
        }
        if (g->exec) cudaGraphExecDestroy(g->exec);
        memset(g, 0, sizeof *g);
        g->key = key;
    }
    g->last_use = ++cb->clock;
    if (g->seen++ == 0 || g->exec) return; /* first time: run eagerly */
    cudaError_t rc = cudaStreamBeginCapture(cb->ctx.stream, cudaStreamCaptureModeRelaxed);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        return; /* run eagerly */
    }
    cb->capturing = (int)(g - cb->graphs);
}

void cu_graph_end(struct backend *b) {
    struct cuda_backend *cb = cu_enter(b);
    if (cb->capturing < 0) return;
    struct graph_ent *g = &cb->graphs[cb->capturing];
    cb->capturing = -1;
    cudaGraph_t graph = NULL;
    cudaError_t rc = cudaStreamEndCapture(cb->ctx.stream, &graph);
    if (rc == cudaSuccess && cu_ok(cb)) rc = cudaGraphInstantiate(&g->exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (rc != cudaSuccess) {
        g->exec = NULL;
        CU_FAIL(cb, rc, "capturing the step graph (SMELT_NO_GRAPH=1 turns graphs off)");
        return;
    }
    if (!cu_ok(cb)) return;
    /* the captured ops have not run yet */
    rc = cudaGraphLaunch(g->exec, cb->ctx.stream);
    if (rc != cudaSuccess) CU_FAIL(cb, rc, "graph launch");
}
