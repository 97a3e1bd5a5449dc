/* The table of settings (config.h): one entry per setting, from which the YAML keys, the
 * SMELT_* environment variables, the flags, --help and `smelt config` are derived.
 * docs/config.md lists them; tests/unit/test_config.c checks that the two agree. */
#include "config/config.h"

#include <string.h>

#define S CFG_SERVE
#define M (CFG_SERVE | CFG_PER_MODEL)
#define BIG ((double)(1 << 24))
#define I64 9.2233720368547748e18 /* 2^63: the largest double below it is in range */

const struct cfg_def cfg_defs[CFG_N] = {
    /* ---- models ---- */
    [CFG_MODEL] = {"model", 'm', CFG_LIST, CFG_SEC_MODELS, S | CFG_POSITIONAL, NULL, 0, 0, false,
                   NULL, "MODEL",
                   "a model to serve: a GGUF file, a directory, or org/repo[:quant] (pulled if "
                   "absent); also positional; repeat for several (the first is the default)"},
    [CFG_MODELS_DIR] = {"models_dir", 0, CFG_STR, CFG_SEC_MODELS, S, NULL, 0, 0, false, NULL, "DIR",
                        "also serve every GGUF file (and every folder holding one) in DIR, each "
                        "loaded on its first request"},
    [CFG_SERVED_MODEL_NAME] = {"served_model_name", 0, CFG_LIST, CFG_SEC_MODELS, S, NULL, 0, 0,
                               false, NULL, "NAME",
                               "the model's name in the API (repeat for aliases; default: the "
                               "file name without .gguf); one model only"},
    [CFG_MAX_LOADED_MODELS] = {"max_loaded_models", 0, CFG_INT, CFG_SEC_MODELS, S, NULL, 1, 1024,
                               false, NULL, "N",
                               "models loaded at once: loading one more first unloads the least "
                               "recently used idle one (default: no bound; a load that runs out "
                               "of memory also unloads one)"},
    /* ---- server ---- */
    [CFG_HOST] = {"host", 0, CFG_STR, CFG_SEC_SERVER, S, "127.0.0.1", 0, 0, false, NULL, "ADDR",
                  "listen address (0.0.0.0 for all)"},
    [CFG_PORT] = {"port", 0, CFG_INT, CFG_SEC_SERVER, S, "8080", 0, 65535, false, NULL, "N",
                  "port (0 picks a free one)"},
    [CFG_API_KEY] = {"api_key", 0, CFG_STR, CFG_SEC_SERVER, S | CFG_SECRET, NULL, 0, 0, false,
                     NULL, "KEY",
                     "require the key (Authorization: Bearer KEY, or x-api-key: KEY); a flag "
                     "is visible in ps: prefer --api-key-file or $SMELT_API_KEY"},
    [CFG_API_KEY_FILE] = {"api_key_file", 0, CFG_STR, CFG_SEC_SERVER, S, NULL, 0, 0, false, NULL,
                          "FILE", "the API key: the first line of FILE"},
    [CFG_HTTP_THREADS] = {"http_threads", 0, CFG_INT, CFG_SEC_SERVER, S, NULL, 0, 256, false,
                          NULL, "N",
                          "HTTP threads (default 2; a quarter of the cores, up to 8, on 16+)"},
    [CFG_TIMEOUT] = {"timeout", 0, CFG_INT, CFG_SEC_SERVER, S, "120", 0, 31536000, false, NULL, "S",
                     "a request (headers and body) must arrive within S seconds; a request "
                     "waiting for its model to load waits as long"},
    [CFG_HEADER_TIMEOUT] = {"header_timeout", 0, CFG_INT, CFG_SEC_SERVER, S, "10", 0, 31536000,
                            false, NULL, "S",
                            "a request's headers must arrive within S seconds; idle "
                            "connections close after S"},
    [CFG_MAX_BODY] = {"max_body", 0, CFG_INT, CFG_SEC_SERVER, S, "33554432", 0, I64, false, NULL,
                      "BYTES", "request body limit"},
    [CFG_BODY_BUDGET] = {"body_budget", 0, CFG_INT, CFG_SEC_SERVER, S, NULL, 1, I64, false, NULL,
                         "BYTES",
                         "request bodies buffered at once, all connections together (default 8 x "
                         "--max-body); 503 past it"},
    [CFG_MAX_CONNECTIONS] = {"max_connections", 0, CFG_INT, CFG_SEC_SERVER, S, NULL, 1, 1 << 20,
                             false, NULL, "N",
                             "open connections (default: from the open-file limit, at most "
                             "8192)"},
    [CFG_MAX_CONNECTIONS_PER_CLIENT] = {"max_connections_per_client", 0, CFG_INT, CFG_SEC_SERVER,
                                        S, NULL, 0, 1 << 20, false, NULL, "N",
                                        "from one client address (default a quarter of "
                                        "--max-connections; 0: no cap, e.g. behind a proxy)"},
    [CFG_ADMIN_PORT] = {"admin_port", 0, CFG_INT, CFG_SEC_SERVER, S, NULL, 0, 65535, false, NULL,
                        "N",
                        "also serve /health and /metrics on port N, with its own connections "
                        "(reachable when the main port is full)"},
    [CFG_ADMIN_HOST] = {"admin_host", 0, CFG_STR, CFG_SEC_SERVER, S, NULL, 0, 0, false, NULL,
                        "ADDR", "the admin port's address (default: --host)"},
    [CFG_CORS_ORIGINS] = {"cors_origins", 0, CFG_STR, CFG_SEC_SERVER, S, NULL, 0, 0, false, NULL,
                          "LIST", "answer CORS preflights and allow browsers from these origins: a "
                                  "comma list, or * (default: none)"},
    [CFG_RESPONSE_STORE] = {"response_store", 0, CFG_INT, CFG_SEC_SERVER, S, NULL, 0, I64, false,
                            NULL, "BYTES", "finished /v1/responses kept in memory for "
                                           "previous_response_id (default 67108864; 0: none)"},
    [CFG_NO_WEBUI] = {"no_webui", 0, CFG_BOOL, CFG_SEC_SERVER, S, NULL, 0, 0, false, NULL, NULL,
                      "do not serve the web chat at /"},
    [CFG_LOG_FORMAT] = {"log_format", 0, CFG_ENUM, CFG_SEC_SERVER, S, "text", 0, 0, false,
                        "text|json", "text|json", "request log lines"},
    [CFG_QUIET] = {"quiet", 0, CFG_BOOL, CFG_SEC_SERVER, S, NULL, 0, 0, false, NULL, NULL,
                   "no request log lines"},
    [CFG_GRACE] = {"grace", 0, CFG_NUM, CFG_SEC_SERVER, S, "30", 0, 1e9, false, NULL, "S",
                   "on SIGTERM, let requests finish for S seconds; a second SIGTERM or SIGINT "
                   "cancels them at once"},
    /* ---- a models: entry's own ---- */
    [CFG_NAME] = {"name", 0, CFG_STR, CFG_SEC_MODELS, S | CFG_ENTRY, NULL, 0, 0, false, NULL,
                  "NAME", "the model's name in the API (default: the file name without .gguf)"},
    [CFG_ALIASES] = {"aliases", 0, CFG_LIST, CFG_SEC_MODELS, S | CFG_ENTRY, NULL, 0, 0, false,
                     NULL, "NAME", "other names requests may use"},
    [CFG_PINNED] = {"pinned", 0, CFG_BOOL, CFG_SEC_MODELS, S | CFG_ENTRY, NULL, 0, 0, false, NULL,
                    NULL, "loaded at start and never unloaded"},
    /* ---- per model ---- */
    [CFG_CHAT_TEMPLATE] = {"chat_template", 0, CFG_STR, CFG_SEC_ENGINE, M, NULL, 0, 0, false,
                           NULL, "FILE", "a Jinja chat template instead of the model's own"},
    [CFG_ALLOW_UNKNOWN_PRETOKENIZER] = {"allow_unknown_pretokenizer", 0, CFG_BOOL, CFG_SEC_ENGINE,
                                        M, NULL, 0, 0, false, NULL, NULL,
                                        "load a tokenizer.ggml.pre smelt does not implement with "
                                        "GPT-2's split (token ids may differ from the model's)"},
    [CFG_BACKEND] = {"backend", 0, CFG_ENUM, CFG_SEC_ENGINE, M, "auto", 0, 0, false,
                     "auto|cpu|cuda", "auto|cpu|cuda", "where the model runs (auto: cuda when "
                                                       "a GPU is visible)"},
    [CFG_DEVICE] = {"device", 0, CFG_INT, CFG_SEC_ENGINE, M, NULL, 0, 1024, false, NULL, "N",
                    "a CUDA device index (0, 1, ...; default 0)"},
    [CFG_N_CPU_MOE] = {"n_cpu_moe", 0, CFG_INT, CFG_SEC_ENGINE, M, "0", 0, 65536, false, NULL, "N",
                       "keep the experts of the first N layers in host memory and run them on "
                       "the CPU (a mixture of experts larger than the GPU)"},
    [CFG_THREADS] = {"threads", 't', CFG_INT, CFG_SEC_ENGINE, M, NULL, 0, 4096, false, NULL, "N",
                     "CPU threads (default: all cores)"},
    [CFG_MAX_SEQS] = {"max_seqs", 0, CFG_INT, CFG_SEC_ENGINE, M, "64", 0, 1 << 20, false, NULL,
                      "N", "sequences in flight"},
    [CFG_MAX_BATCH_TOKENS] = {"max_batch_tokens", 0, CFG_INT, CFG_SEC_ENGINE, M, NULL, 0, BIG,
                              false, NULL, "N",
                              "tokens per step: decodes + prefill chunks (default: 2048 on a GPU, "
                              "512 on the CPU)"},
    [CFG_ITL_TARGET_MS] = {"itl_target_ms", 0, CFG_NUM, CFG_SEC_ENGINE, M, "0", 0, 1e6, false, NULL,
                           "MS", "with sequences decoding, cut a step's prefill rows to what is "
                                 "predicted to run in MS (at least 64 rows; 0: no cut)"},
    [CFG_MAX_WAITING] = {"max_waiting", 0, CFG_INT, CFG_SEC_ENGINE, M, "1024", 0, BIG, false, NULL,
                         "N", "queued sequences before 429"},
    [CFG_CTX_SIZE] = {"ctx_size", 'c', CFG_INT, CFG_SEC_ENGINE, M, NULL, 0, BIG, false, NULL, "N",
                      "context per sequence (default: the model's, capped by the KV pool)"},
    [CFG_KV_SIZE] = {"kv_size", 0, CFG_INT, CFG_SEC_ENGINE, M, NULL, 0, I64, false, NULL, "N",
                     "KV pool size in tokens (default: from --gpu-memory-utilization on CUDA; "
                     "32768 tokens or 25% of free memory on the CPU)"},
    [CFG_GPU_MEMORY_UTILIZATION] = {"gpu_memory_utilization", 0, CFG_NUM, CFG_SEC_ENGINE, M, "0.9",
                                    0, 1, true, NULL, "F",
                                    "fraction of device memory the model may use"},
    [CFG_BLOCK_SIZE] = {"block_size", 0, CFG_INT, CFG_SEC_ENGINE, M, "16", 0, 1024, false, NULL,
                        "N", "KV block size in tokens"},
    [CFG_NO_PREFIX_CACHE] = {"no_prefix_cache", 0, CFG_BOOL, CFG_SEC_ENGINE, M, NULL, 0, 0, false,
                             NULL, NULL, "do not reuse the KV of shared prompt prefixes"},
    [CFG_F32_KV] = {"f32_kv", 0, CFG_BOOL, CFG_SEC_ENGINE, M, NULL, 0, 0, false, NULL, NULL,
                    "F32 KV cache (default F16)"},
    [CFG_TTL] = {"ttl", 0, CFG_NUM, CFG_SEC_ENGINE, M, NULL, 0, 1e9, false, NULL, "S",
                 "unload the model after S seconds without a request (0 or unset: never; "
                 "pinned models stay)"},
    /* ---- sampling defaults: the model file's general.sampling.* < these < the request ---- */
    [CFG_TEMP] = {"temp", 0, CFG_NUM, CFG_SEC_SAMPLING, M, NULL, 0, 100, false, NULL, "X",
                  "temperature of requests that give none (0: greedy; default: the model "
                  "file's general.sampling.temp, else 1)"},
    [CFG_TOP_K] = {"top_k", 0, CFG_INT, CFG_SEC_SAMPLING, M, NULL, -1, 1 << 30, false, NULL, "N",
                   "top-k (<= 0: off; default: the file's, else off)"},
    [CFG_TOP_P] = {"top_p", 0, CFG_NUM, CFG_SEC_SAMPLING, M, NULL, 0, 1, false, NULL, "X",
                   "top-p (1: off; 0: greedy; default: the file's, else off)"},
    [CFG_MIN_P] = {"min_p", 0, CFG_NUM, CFG_SEC_SAMPLING, M, NULL, 0, 1, false, NULL, "X",
                   "min-p (0: off; default: the file's, else off)"},
    [CFG_REPEAT_PENALTY] = {"repeat_penalty", 0, CFG_NUM, CFG_SEC_SAMPLING, M, NULL, 0, 100, true,
                            NULL, "X",
                            "repetition penalty (1: off; default: the file's "
                            "general.sampling.penalty_repeat, else off)"},
    [CFG_REPEAT_LAST_N] = {"repeat_last_n", 0, CFG_INT, CFG_SEC_SAMPLING, M, NULL, -1, 2147483647.,
                           false, NULL, "N",
                           "the penalty's window: the last N tokens (-1: all, 0: no penalty; "
                           "default: the file's penalty_last_n, else all)"},
    [CFG_SEED] = {"seed", 0, CFG_INT, CFG_SEC_SAMPLING, M, NULL, 0, I64, false, NULL, "N",
                  "seed of requests that give none (the same request then gives the same text; "
                  "default: a random one per request)"},
    /* ---- speculative decoding (docs/speculative.md): per model, a draft goes with its
     * target ---- */
    [CFG_SPEC] = {"spec", 0, CFG_ENUM, CFG_SEC_SPEC, M, NULL, 0, 0, false, "ngram|draft|mtp|off",
                  "ngram|draft|mtp|off",
                  "the proposer: n-gram prompt lookup, a draft model, the model's MTP head, or "
                  "none (default: draft with --draft, else off)"},
    [CFG_DRAFT] = {"draft", 0, CFG_STR, CFG_SEC_SPEC, M, NULL, 0, 0, false, NULL, "MODEL",
                   "a draft model with the target's vocabulary: a GGUF file, a directory or "
                   "org/repo[:quant]; loaded and unloaded with its target, on its device, its KV "
                   "in the target's memory plan"},
    [CFG_SPEC_K] = {"spec_k", 0, CFG_INT, CFG_SEC_SPEC, M, "4", 1, 16, false, NULL, "N",
                    "draft tokens per step at most"},
    [CFG_SPEC_MAX_BATCH] = {"spec_max_batch", 0, CFG_INT, CFG_SEC_SPEC, M, "8", 1, 1 << 20, false,
                            NULL, "N", "no speculation in a step with more decoding sequences"},
    [CFG_SPEC_FIXED] = {"spec_fixed", 0, CFG_BOOL, CFG_SEC_SPEC, M, NULL, 0, 0, false, NULL, NULL,
                        "propose k tokens every step (no adaptive k: measurements)"},
    /* ---- tests and benchmarks ---- */
    [CFG_FAKE_FORWARD] = {"fake_forward", 0, CFG_BOOL, CFG_SEC_TEST, M, NULL, 0, 0, false, NULL,
                          NULL, "no model compute: fixed logits (server benchmarks)"},
    [CFG_FAKE_STEP_MS] = {"fake_step_ms", 0, CFG_NUM, CFG_SEC_TEST, M, NULL, 0, 1e6, false, NULL,
                          "X", "with --fake-forward: sleep X ms per step"},
    [CFG_FAKE_REPLY] = {"fake_reply", 0, CFG_STR, CFG_SEC_TEST, M, NULL, 0, 0, false, NULL, "TEXT",
                        "with --fake-forward: every reply is TEXT (tests; one reply at a time per "
                        "prompt prefix)"},
    [CFG_FAKE_FAIL_AT] = {"fake_fail_at", 0, CFG_INT, CFG_SEC_TEST, M, NULL, 0, BIG, false, NULL,
                          "N", "with --fake-forward: a step with a row at position >= N fails "
                               "(tests: engine errors)"},
    [CFG_FAKE_LOAD_MS] = {"fake_load_ms", 0, CFG_NUM, CFG_SEC_TEST, M, NULL, 0, 1e6, false, NULL,
                          "X", "loading the model takes X ms longer (tests: requests during a "
                               "load)"},
};

int cfg_find(const char *key) {
    for (int i = 0; i < CFG_N; i++)
        if (!strcmp(cfg_defs[i].key, key)) return i;
    return -1;
}
