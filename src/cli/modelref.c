/* Model references -> local GGUF paths (see modelref.h), and the download progress display. */
#include "cli/modelref.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hub/hub_internal.h"
#include "util/log.h"

/* ---- progress ---- */

void cli_progress_init(struct cli_progress *p, bool quiet) {
    memset(p, 0, sizeof *p);
    p->tty = isatty(STDERR_FILENO);
    p->quiet = quiet;
    p->last_decile = -1;
}

/* "1.23 GiB" style. */
static void human(double b, char *out, size_t n) {
    static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) {
        b /= 1024;
        i++;
    }
    snprintf(out, n, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

static void duration(double s, char *out, size_t n) {
    if (s < 0 || s > 360000) {
        snprintf(out, n, "--:--");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(out, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(out, n, "%ld:%02ld", t / 60, t % 60);
}

static int term_width(void) {
    struct winsize ws;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40) return ws.ws_col;
    return 80;
}

void cli_hub_progress(void *ctx, const struct hub_progress *p) {
    struct cli_progress *c = ctx;
    if (c->quiet) return;
    if (p->index != c->last_file) {
        c->last_file = p->index;
        c->last_line = 0;
        c->last_decile = -1;
        c->rate = 0;
        c->sample_t = p->elapsed;
        c->sample_done = c->first_done = p->done;
    }
    if (p->done < c->sample_done) { /* the transfer restarted from zero */
        c->sample_done = c->first_done = p->done;
        c->sample_t = p->elapsed;
    }
    double dt = p->elapsed - c->sample_t;
    if (dt >= 0.5) { /* rate over the last half second, smoothed: a retry's pause shows */
        double inst = (double)(p->done - c->sample_done) / dt;
        c->rate = c->rate > 0 ? 0.7 * c->rate + 0.3 * inst : inst;
        c->sample_t = p->elapsed;
        c->sample_done = p->done;
    }
    double avg = p->elapsed > 0 ? (double)(p->done - c->first_done) / p->elapsed : 0;
    double rate = p->finished ? avg : c->rate;
    double pct = p->total ? 100.0 * (double)p->done / (double)p->total : 0;
    double eta = (rate > 0 && p->total > p->done) ? (double)(p->total - p->done) / rate : -1;
    char done[32], total[32], rt[32], et[32];
    human((double)p->done, done, sizeof done);
    human((double)p->total, total, sizeof total);
    human(rate, rt, sizeof rt);
    duration(p->finished ? p->elapsed : eta, et, sizeof et);
    const char *base = strrchr(p->file, '/');
    base = base ? base + 1 : p->file;
    char label[64];
    if (p->count > 1) snprintf(label, sizeof label, "[%d/%d] %.40s", p->index, p->count, base);
    else snprintf(label, sizeof label, "%.48s", base);

    if (c->tty) {
        char stats[192];
        snprintf(stats, sizeof stats, " %5.1f%% %s/%s %s/s %s%s", pct, done, total, rt,
                 p->finished ? "in " : "eta ", et);
        int width = term_width() - 1;
        int bar = width - (int)strlen(label) - (int)strlen(stats) - 3;
        if (bar > 40) bar = 40;
        fprintf(stderr, "\r%s ", label);
        if (bar >= 5 && p->total) {
            int fill = (int)(pct / 100.0 * bar);
            fputc('[', stderr);
            for (int i = 0; i < bar; i++) fputc(i < fill ? '#' : '.', stderr);
            fputc(']', stderr);
        }
        /* the cursor goes back to column 0, so a log line (a retry) overwrites the bar */
        fprintf(stderr, "%s\033[K%s", stats, p->finished ? "\n" : "\r");
        fflush(stderr);
        return;
    }
    int decile = (int)(pct / 10);
    if (p->finished) {
        if (p->done == p->resumed && p->elapsed == 0)
            fprintf(stderr, "smelt: %s: %s, already in the cache\n", label, done);
        else
            fprintf(stderr, "smelt: %s: %s done in %s (%s/s)\n", label, done, et, rt);
    } else if (p->elapsed - c->last_line >= 5 || (p->total && decile > c->last_decile && decile > 0 &&
                                                  p->elapsed - c->last_line >= 1)) {
        fprintf(stderr, "smelt: %s: %.0f%% (%s of %s), %s/s, eta %s\n", label, pct, done, total,
                rt, et);
        c->last_line = p->elapsed;
        c->last_decile = decile;
    } else {
        return;
    }
    fflush(stderr);
}

/* ---- references ---- */

static bool ends_with_ci(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcasecmp(s + n - m, suf);
}

static bool looks_like_path(const char *s) {
    return s[0] == '/' || s[0] == '~' || !strncmp(s, "./", 2) || !strncmp(s, "../", 3) ||
           ends_with_ci(s, ".gguf") || !strchr(s, '/');
}

static smelt_status copy_out(const char *src, char *out, size_t n, struct err *e) {
    if (strlen(src) >= n) return err_set(e, SMELT_ERR_RANGE, "path too long: %.80s...", src);
    strcpy(out, src);
    return SMELT_OK;
}

bool cli_model_is_local(const char *ref) {
    struct stat sb;
    return ref && (stat(ref, &sb) == 0 || looks_like_path(ref));
}

smelt_status cli_resolve_model(const char *ref, bool allow_pull, char *path_out, size_t n,
                               struct err *e) {
    struct err local;
    if (!e) e = &local;
    if (!ref || !*ref) return err_set(e, SMELT_ERR_INVALID, "no model given");
    struct stat sb;
    if (stat(ref, &sb) == 0) {
        if (S_ISDIR(sb.st_mode)) return hub_find_in_dir(ref, "", path_out, n, e);
        int no, count;
        size_t pl;
        if (hub_split_info(ref, &no, &count, &pl) && no != 1) {
            char first[HUB_PATH_MAX];
            int w = snprintf(first, sizeof first, "%.*s-00001-of-%05d.gguf", (int)pl, ref, count);
            if (w > 0 && (size_t)w < sizeof first && stat(first, &sb) == 0)
                return copy_out(first, path_out, n, e);
        }
        return copy_out(ref, path_out, n, e);
    }
    if (looks_like_path(ref)) return err_set(e, SMELT_ERR_NOT_FOUND, "no such file: %s", ref);

    struct hub_ref r;
    smelt_status st = hub_parse_ref(ref, &r, e);
    if (st) return st;
    struct hub_opts o;
    if ((st = hub_opts_from_env(&o, e))) return st;
    if (hub_find_cached(&o, &r, path_out, n, e) == SMELT_OK) {
        log_debug("%s -> %s (cache)", ref, path_out);
        return SMELT_OK;
    }
    if (o.offline) return err_prefix(e, "offline (HF_HUB_OFFLINE is set)");
    if (!allow_pull) {
        char msg[ERR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", e->msg);
        return err_set(e, SMELT_ERR_NOT_FOUND, "%s; run 'smelt pull %s' first", msg, ref);
    }
    log_info("%s is not in the cache (%s): pulling it from %s", ref, o.cache, o.endpoint);
    struct cli_progress prog;
    cli_progress_init(&prog, false);
    o.progress = cli_hub_progress;
    o.progress_ctx = &prog;
    return hub_pull(&o, &r, path_out, n, e);
}
