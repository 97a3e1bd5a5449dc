/* Streaming load generator for an OpenAI-compatible /v1/completions endpoint, in C so the
 * client costs little next to the server it measures (on a 2-core machine a Python client
 * would take one of them). One epoll thread drives every connection.
 *
 *   build/bench_serve [-H HOST] [-p PORT] [-c CLIENTS] [-r REQUESTS] [-n TOKENS] [-w WORDS]
 *                     [-i IDLE] [-m MODEL]
 *
 * Each of CLIENTS clients sends REQUESTS streaming requests in a row (a new connection each,
 * "Connection: close"), each a prompt of WORDS words and exactly TOKENS generated tokens
 * (temperature 0, ignore_eos) — the same load as ../shared/bench/loadgen.py. IDLE extra
 * connections are opened first and held open, silent, for the whole run. Prints one JSON
 * line: aggregate generated chunks per second, time to first token and inter-token latency
 * percentiles, and the client's own CPU time.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"

struct client {
    int id, fd, done_reqs;
    char *req;
    size_t req_len, sent;
    /* response parsing: headers, then chunked body, then SSE lines */
    int state; /* 0 headers, 1 chunk size, 2 chunk data, 3 chunk crlf, 4 finished */
    char hdr[8192];
    size_t hdr_len;
    size_t chunk_left;
    char line[256];
    size_t line_len;
    char ev[16];   /* start of the current SSE event, enough to classify it */
    size_t ev_len;
    bool at_line_start;
    double t_send, t_last;
    int chunks;
    bool ok;
};

static double *ttft, *itl;
static size_t n_ttft, n_itl, cap_itl;
static long total_chunks, errors;

static void add_itl(double v) {
    if (n_itl == cap_itl) {
        cap_itl = cap_itl ? cap_itl * 2 : 65536;
        itl = realloc(itl, cap_itl * sizeof *itl);
    }
    itl[n_itl++] = v;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p) {
    if (!n) return 0;
    return v[(size_t)(p * (double)(n - 1))];
}

static const char *words[] = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta",
                              "iota", "kappa", "lambda", "mu", "nu", "xi", "omicron", "pi", "rho",
                              "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega"};

static void make_request(struct client *c, const char *host, int port, const char *model,
                         int n_words, int n_tokens) {
    char prompt[65536];
    size_t p = 0;
    for (int k = 0; k < n_words && p + 16 < sizeof prompt; k++)
        p += (size_t)snprintf(prompt + p, sizeof prompt - p, "%s%s", k ? " " : "",
                              words[(c->id * 7 + c->done_reqs * 3 + k) % 24]);
    char body[70000];
    int bl = snprintf(body, sizeof body,
                      "{\"model\":\"%s\",\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0,"
                      "\"stream\":true,\"ignore_eos\":true}",
                      model, prompt, n_tokens);
    free(c->req);
    c->req = malloc((size_t)bl + 512);
    c->req_len = (size_t)snprintf(c->req, (size_t)bl + 512,
                                  "POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\n"
                                  "Content-Type: application/json\r\nConnection: close\r\n"
                                  "Content-Length: %d\r\n\r\n%s",
                                  host, port, bl, body);
}

static int open_conn(struct sockaddr_in *a) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)a, sizeof *a) != 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    return fd;
}

/* One SSE byte: counts the events that carry a choice (a token), as loadgen.py does. */
static void sse_byte(struct client *c, char ch) {
    if (c->at_line_start) {
        c->ev_len = 0;
        c->at_line_start = false;
    }
    if (ch == '\n') {
        c->at_line_start = true;
        return;
    }
    if (c->ev_len < sizeof c->ev) c->ev[c->ev_len++] = ch;
    if (c->ev_len == 8 && !memcmp(c->ev, "data: {\"", 8)) {
        /* a data event: completions chunks have "choices":[{...}] (the usage chunk has []) */
        c->ev_len = sizeof c->ev; /* classify once; the body is not needed */
        double t = clock_now();
        if (c->chunks == 0) ttft[n_ttft++] = t - c->t_send;
        else add_itl(t - c->t_last);
        c->t_last = t;
        c->chunks++;
        total_chunks++;
    }
}

/* Feeds response bytes through the HTTP / chunked / SSE parsers. */
static void feed(struct client *c, const char *buf, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char ch = buf[i];
        switch (c->state) {
        case 0:
            if (c->hdr_len < sizeof c->hdr - 1) c->hdr[c->hdr_len++] = ch;
            if (c->hdr_len >= 4 && !memcmp(c->hdr + c->hdr_len - 4, "\r\n\r\n", 4)) {
                c->hdr[c->hdr_len] = 0;
                c->ok = !strncmp(c->hdr, "HTTP/1.1 200", 12);
                c->state = 1;
                c->line_len = 0;
            }
            break;
        case 1:
            if (ch == '\n') {
                c->line[c->line_len] = 0;
                c->chunk_left = strtoul(c->line, NULL, 16);
                c->line_len = 0;
                c->state = c->chunk_left ? 2 : 4;
            } else if (ch != '\r' && c->line_len < sizeof c->line - 1) {
                c->line[c->line_len++] = ch;
            }
            break;
        case 2:
            sse_byte(c, ch);
            if (--c->chunk_left == 0) c->state = 3;
            break;
        case 3:
            if (ch == '\n') c->state = 1;
            break;
        default:
            break;
        }
    }
}

int main(int argc, char **argv) {
    const char *host = "127.0.0.1", *model = "m";
    int port = 8080, n_clients = 8, n_reqs = 2, n_tokens = 128, n_words = 72, n_idle = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "-H")) host = v;
        else if (!strcmp(a, "-p")) port = atoi(v);
        else if (!strcmp(a, "-c")) n_clients = atoi(v);
        else if (!strcmp(a, "-r")) n_reqs = atoi(v);
        else if (!strcmp(a, "-n")) n_tokens = atoi(v);
        else if (!strcmp(a, "-w")) n_words = atoi(v);
        else if (!strcmp(a, "-i")) n_idle = atoi(v);
        else if (!strcmp(a, "-m")) model = v;
        else {
            fprintf(stderr, "usage: bench_serve [-H host] [-p port] [-c clients] [-r requests] "
                            "[-n tokens] [-w words] [-i idle] [-m model]\n");
            return 2;
        }
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, host, &a.sin_addr);

    int *idle = calloc((size_t)n_idle + 1, sizeof *idle);
    int n_idle_ok = 0;
    for (int i = 0; i < n_idle; i++) {
        idle[i] = open_conn(&a);
        if (idle[i] >= 0) n_idle_ok++;
    }
    usleep(200000);

    ttft = calloc((size_t)(n_clients * n_reqs) + 1, sizeof *ttft);
    struct client *cs = calloc((size_t)n_clients, sizeof *cs);
    int ep = epoll_create1(0);
    int active = 0;
    double t0 = clock_now();
    for (int i = 0; i < n_clients; i++) {
        struct client *c = &cs[i];
        c->id = i;
        c->fd = -1;
    }
    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    /* start every client */
    for (int i = 0; i < n_clients; i++) {
        struct client *c = &cs[i];
        make_request(c, host, port, model, n_words, n_tokens);
        c->fd = open_conn(&a);
        c->sent = 0;
        c->state = 0;
        c->hdr_len = 0;
        c->chunks = 0;
        c->at_line_start = true;
        c->t_send = clock_now();
        struct epoll_event ev = {.events = EPOLLOUT | EPOLLIN, .data.ptr = c};
        epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
        active++;
    }
    struct epoll_event evs[256];
    char buf[65536];
    while (active > 0) {
        int k = epoll_wait(ep, evs, 256, 60000);
        if (k <= 0) {
            fprintf(stderr, "bench_serve: no progress for 60 s (%d active)\n", active);
            break;
        }
        for (int e = 0; e < k; e++) {
            struct client *c = evs[e].data.ptr;
            if ((evs[e].events & EPOLLOUT) && c->sent < c->req_len) {
                ssize_t w = send(c->fd, c->req + c->sent, c->req_len - c->sent, MSG_NOSIGNAL);
                if (w > 0) c->sent += (size_t)w;
                if (c->sent == c->req_len) {
                    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
                    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
                }
            }
            if (!(evs[e].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) continue;
            ssize_t r = recv(c->fd, buf, sizeof buf, 0);
            if (r > 0) {
                feed(c, buf, (size_t)r);
                if (c->state != 4) continue;
            } else if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
                continue;
            }
            /* this request is over */
            epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
            close(c->fd);
            if (!c->ok || c->chunks == 0) errors++;
            c->done_reqs++;
            if (c->done_reqs < n_reqs) {
                make_request(c, host, port, model, n_words, n_tokens);
                c->fd = open_conn(&a);
                c->sent = 0;
                c->state = 0;
                c->hdr_len = 0;
                c->chunks = 0;
                c->at_line_start = true;
                c->t_send = clock_now();
                struct epoll_event ev = {.events = EPOLLOUT | EPOLLIN, .data.ptr = c};
                epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
            } else {
                active--;
            }
        }
    }
    double dt = clock_now() - t0;
    getrusage(RUSAGE_SELF, &ru1);
    double cpu = (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec + ru1.ru_stime.tv_sec -
                          ru0.ru_stime.tv_sec) +
                 (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec + ru1.ru_stime.tv_usec -
                          ru0.ru_stime.tv_usec) * 1e-6;
    /* the idle connections must still be open: the server did not drop them */
    int idle_alive = 0;
    for (int i = 0; i < n_idle; i++) {
        if (idle[i] < 0) continue;
        char b;
        ssize_t r = recv(idle[i], &b, 1, MSG_DONTWAIT);
        if (r < 0 && errno == EAGAIN) idle_alive++;
        close(idle[i]);
    }
    qsort(ttft, n_ttft, sizeof *ttft, cmp);
    qsort(itl, n_itl, sizeof *itl, cmp);
    printf("{\"clients\": %d, \"requests\": %d, \"gen_chunks\": %ld, \"errors\": %ld, "
           "\"seconds\": %.2f, \"gen_tok_s\": %.1f, \"ttft_p50_ms\": %.1f, \"ttft_p90_ms\": %.1f, "
           "\"itl_p50_ms\": %.2f, \"itl_p90_ms\": %.2f, \"itl_p99_ms\": %.2f, "
           "\"idle_conns\": %d, \"idle_alive\": %d, \"client_cpu_s\": %.2f}\n",
           n_clients, n_clients * n_reqs, total_chunks, errors, dt, (double)total_chunks / dt,
           pct(ttft, n_ttft, 0.5) * 1e3, pct(ttft, n_ttft, 0.9) * 1e3, pct(itl, n_itl, 0.5) * 1e3,
           pct(itl, n_itl, 0.9) * 1e3, pct(itl, n_itl, 0.99) * 1e3, n_idle_ok, idle_alive, cpu);
    return errors ? 1 : 0;
}
