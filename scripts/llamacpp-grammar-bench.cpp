// llama.cpp's grammar sampler on the same work as smelt's build/bench_grammar "text" rows
// (issue #20: "compare with llama.cpp's GBNF on the same schema: mask time per token"):
// the same tool-call schema, converted by llama.cpp's own json_schema_to_grammar (what
// llama-server does with a request's json_schema), the same five documents tokenized by
// the same vocabulary, and per token the time of llama_sampler_apply over the whole
// vocabulary (the mask: refused tokens set to -inf) then llama_sampler_accept. Wall clock,
// one thread; p50 / p99 / max, the first pass (cold) and a second (warm) apart.
//
// Not part of smelt's build: it links a llama.cpp build (a snapshot built elsewhere, never
// committed), e.g.
//   g++ -O2 -std=c++17 scripts/llamacpp-grammar-bench.cpp -I$L/include -I$L/common \
//       -I$L/ggml/include -I$L/vendor -L$L/build/bin -lllama -lllama-common \
//       -Wl,-rpath,$L/build/bin -o /tmp/llamacpp-grammar-bench
//   /tmp/llamacpp-grammar-bench models/qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf
// The schema and documents are copied from tests/bench/bench_grammar.c (keep them equal).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "json-schema-to-grammar.h"
#include "llama.h"

static const char *SCHEMA =
    "{\"type\": \"object\", \"properties\": {"
    "\"location\": {\"type\": \"string\", \"description\": \"City and state, e.g. San Francisco, CA\"},"
    "\"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]},"
    "\"days\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 14},"
    "\"include\": {\"type\": \"array\", \"items\": {\"type\": \"string\", \"enum\": [\"hourly\", "
    "\"alerts\", \"uv\", \"air_quality\"]}},"
    "\"notify\": {\"type\": \"object\", \"properties\": {\"email\": {\"type\": \"string\"}, "
    "\"threshold_c\": {\"type\": \"number\"}},"
    " \"required\": [\"email\"], \"additionalProperties\": false}},"
    "\"required\": [\"location\", \"unit\"], \"additionalProperties\": false}";

static const char *DOCS[] = {
    "{\"location\": \"San Francisco, CA\", \"unit\": \"fahrenheit\"}",
    "{\"location\": \"Paris, France\", \"unit\": \"celsius\", \"days\": 5, \"include\": [\"hourly\", \"uv\"]}",
    "{\n  \"location\": \"Tokyo\",\n  \"unit\": \"celsius\",\n  \"days\": 14,\n  \"include\": [\"alerts\"],\n"
    "  \"notify\": {\"email\": \"ops@example.com\", \"threshold_c\": 35.5}\n}",
    "{\"location\": \"Reykjavík, Iceland\", \"unit\": \"celsius\", \"days\": 3, \"notify\": {\"email\": \"a@b.is\"}}",
    "{\"location\": \"New York City, NY (Manhattan, near Central Park)\", \"unit\": \"fahrenheit\", \"days\": 7, "
    "\"include\": [\"hourly\", \"alerts\", \"uv\", \"air_quality\"]}",
};

static double pct(std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[std::min(v.size() - 1, (size_t)(q * v.size()))];
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    const llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    auto t0 = std::chrono::steady_clock::now();
    std::string gbnf = json_schema_to_grammar(nlohmann::ordered_json::parse(SCHEMA));
    double conv_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::vector<llama_token_data> cand(n_vocab);
    for (int pass = 0; pass < 2; pass++) {
        std::vector<double> mask_us, accept_us;
        double init_ms = 0;
        for (const char *doc : DOCS) {
            t0 = std::chrono::steady_clock::now();
            llama_sampler *g = llama_sampler_init_grammar(vocab, gbnf.c_str(), "root");
            init_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            if (!g) {
                fprintf(stderr, "grammar refused\n");
                return 1;
            }
            std::vector<llama_token> toks(4096);
            int n = llama_tokenize(vocab, doc, (int)strlen(doc), toks.data(), (int)toks.size(), false, false);
            toks.resize(n > 0 ? n : 0);
            for (llama_token t : toks) {
                for (int i = 0; i < n_vocab; i++) cand[i] = {i, 0.0f, 0.0f};
                llama_token_data_array arr = {cand.data(), (size_t)n_vocab, -1, false};
                auto a = std::chrono::steady_clock::now();
                llama_sampler_apply(g, &arr);
                auto b = std::chrono::steady_clock::now();
                if (std::isinf(cand[t].logit)) {
                    fprintf(stderr, "the grammar refused token %d of a valid document\n", t);
                    return 1;
                }
                llama_sampler_accept(g, t);
                auto c = std::chrono::steady_clock::now();
                mask_us.push_back(std::chrono::duration<double, std::micro>(b - a).count());
                accept_us.push_back(std::chrono::duration<double, std::micro>(c - b).count());
            }
            llama_sampler_free(g);
        }
        printf("%s: %zu tokens, mask p50 %.1f us, p99 %.1f us, max %.1f us; accept p50 %.1f us; "
               "grammar init %.2f ms per document; schema -> GBNF %.2f ms\n",
               pass ? "warm" : "cold", mask_us.size(), pct(mask_us, .5), pct(mask_us, .99),
               pct(mask_us, 1.0), pct(accept_us, .5), init_ms / 5, conv_ms);
    }
    llama_model_free(model);
    return 0;
}
