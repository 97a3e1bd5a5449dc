/* The Hugging Face hub cache on disk (layout in hub.h), written the way huggingface_hub
 * writes it so both read each other's files:
 * - refs/<rev> holds the 40-hex commit with no newline, replaced atomically;
 * - snapshots/<commit>/<path> is a relative symlink "../../blobs/<etag>" (one more "../"
 *   per directory level of path);
 * - .locks/models--org--repo/<etag>.lock is held with flock(2) while a blob is fetched
 *   (huggingface_hub's filelock uses flock too, so smelt and it never fetch one blob at once).
 * Every name joined here was validated (hub_valid_repo_id / hub_valid_relpath / hex); the
 * directories under snapshots/ are created one by one and a symlinked one is refused, so
 * a planted link cannot carry a write outside the cache. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hub/hub_internal.h"
#include "util/array.h"
#include "util/log.h"

smelt_status hub_repo_dir(const char *cache, const char *repo, char *out, size_t n,
                          struct err *e) {
    if (!hub_valid_repo_id(repo)) return err_set(e, SMELT_ERR_INVALID, "bad repo id '%s'", repo);
    const char *slash = strchr(repo, '/');
    int w = snprintf(out, n, "%s/models--%.*s--%s", cache, (int)(slash - repo), repo, slash + 1);
    if (w < 0 || (size_t)w >= n) return err_set(e, SMELT_ERR_RANGE, "cache path too long");
    return SMELT_OK;
}

smelt_status hub_mkdirs(const char *path, struct err *e) {
    char buf[HUB_PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return err_set(e, SMELT_ERR_RANGE, "path too long");
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != 0) continue;
        char c = buf[i];
        buf[i] = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return err_set(e, SMELT_ERR_IO, "cannot create directory %s: %s", buf, strerror(errno));
        buf[i] = c;
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return err_set(e, SMELT_ERR_IO, "%s is not a directory", path);
    return SMELT_OK;
}

smelt_status hub_read_ref(const char *repo_dir, const char *rev, char commit[41], struct err *e) {
    if (hub_is_hex(rev, 40)) {
        memcpy(commit, rev, 41);
        return SMELT_OK;
    }
    if (!hub_valid_relpath(rev)) return err_set(e, SMELT_ERR_INVALID, "bad revision '%s'", rev);
    char path[HUB_PATH_MAX];
    int w = snprintf(path, sizeof path, "%s/refs/%s", repo_dir, rev);
    if (w < 0 || (size_t)w >= sizeof path) return err_set(e, SMELT_ERR_RANGE, "path too long");
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(e, SMELT_ERR_NOT_FOUND, "no ref %s in the cache", rev);
    char buf[64] = {0};
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    while (got && (buf[got - 1] == '\n' || buf[got - 1] == '\r' || buf[got - 1] == ' ')) got--;
    buf[got] = 0;
    if (!hub_is_hex(buf, 40))
        return err_set(e, SMELT_ERR_FORMAT, "%s does not hold a commit hash", path);
    memcpy(commit, buf, 41);
    return SMELT_OK;
}

/* Writes data to path through a unique temporary name and rename(2). */
static smelt_status write_atomic(const char *path, const char *data, size_t n, struct err *e) {
    char tmp[HUB_PATH_MAX];
    int w = snprintf(tmp, sizeof tmp, "%s.%ld.%ld.tmp", path, (long)getpid(), (long)time(NULL));
    if (w < 0 || (size_t)w >= sizeof tmp) return err_set(e, SMELT_ERR_RANGE, "path too long");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) return err_set(e, SMELT_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
    ssize_t wr = write(fd, data, n);
    int cl = close(fd);
    if (wr != (ssize_t)n || cl != 0 || rename(tmp, path) != 0) {
        int er = errno;
        unlink(tmp);
        return err_set(e, SMELT_ERR_IO, "cannot write %s: %s", path, strerror(er));
    }
    return SMELT_OK;
}

smelt_status hub_write_ref(const char *repo_dir, const char *rev, const char *commit,
                           struct err *e) {
    if (!strcmp(rev, commit)) return SMELT_OK; /* a commit needs no ref */
    if (!hub_valid_relpath(rev) || !hub_is_hex(commit, 40))
        return err_set(e, SMELT_ERR_INVALID, "bad ref %s -> %s", rev, commit);
    char path[HUB_PATH_MAX];
    int w = snprintf(path, sizeof path, "%s/refs/%s", repo_dir, rev);
    if (w < 0 || (size_t)w >= sizeof path) return err_set(e, SMELT_ERR_RANGE, "path too long");
    char old[41];
    struct err tmp;
    if (hub_read_ref(repo_dir, rev, old, &tmp) == SMELT_OK && !strcmp(old, commit)) return SMELT_OK;
    char dir[HUB_PATH_MAX];
    memcpy(dir, path, (size_t)w + 1);
    *strrchr(dir, '/') = 0;
    smelt_status st = hub_mkdirs(dir, e);
    if (st) return st;
    return write_atomic(path, commit, 40, e);
}

void hub_free_names(char **names, size_t n) {
    if (!names) return;
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
}

struct name_list {
    char **v;
    size_t n, cap;
};

static smelt_status push_name(struct name_list *l, const char *s, struct err *e) {
    if (!array_grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v))
        return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    l->v[l->n] = strdup(s);
    if (!l->v[l->n]) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    l->n++;
    return SMELT_OK;
}

/* Walks root/rel (rel "" = root) recursively, depth-limited, collecting regular files. */
static smelt_status walk(const char *root, const char *rel, int depth, struct name_list *l,
                         struct err *e) {
    if (depth > 32 || l->n > 100000) return SMELT_OK;
    char dirpath[HUB_PATH_MAX];
    int w = snprintf(dirpath, sizeof dirpath, "%s%s%s", root, *rel ? "/" : "", rel);
    if (w < 0 || (size_t)w >= sizeof dirpath) return SMELT_OK;
    DIR *d = opendir(dirpath);
    if (!d) return SMELT_OK;
    struct dirent *de;
    smelt_status st = SMELT_OK;
    while (st == SMELT_OK && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char sub[HUB_PATH_MAX], full[HUB_PATH_MAX];
        w = snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", de->d_name);
        if (w < 0 || (size_t)w >= sizeof sub) continue;
        w = snprintf(full, sizeof full, "%s/%s", root, sub);
        if (w < 0 || (size_t)w >= sizeof full) continue;
        struct stat lst, st2;
        if (lstat(full, &lst) != 0) continue;
        if (S_ISDIR(lst.st_mode)) {
            st = walk(root, sub, depth + 1, l, e);
        } else if (S_ISREG(lst.st_mode) || (S_ISLNK(lst.st_mode) && stat(full, &st2) == 0 &&
                                            S_ISREG(st2.st_mode))) {
            st = push_name(l, sub, e);
        }
    }
    closedir(d);
    return st;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

smelt_status hub_snapshot_files(const char *repo_dir, const char *commit, char ***names,
                                size_t *n, struct err *e) {
    char root[HUB_PATH_MAX];
    int w = snprintf(root, sizeof root, "%s/snapshots/%s", repo_dir, commit);
    if (w < 0 || (size_t)w >= sizeof root) return err_set(e, SMELT_ERR_RANGE, "path too long");
    return hub_list_files(root, names, n, e);
}

smelt_status hub_list_files(const char *root, char ***names, size_t *n, struct err *e) {
    *names = NULL;
    *n = 0;
    struct name_list l = {0};
    smelt_status st = walk(root, "", 0, &l, e);
    if (st) {
        hub_free_names(l.v, l.n);
        return st;
    }
    if (l.n) qsort(l.v, l.n, sizeof *l.v, cmp_str);
    *names = l.v;
    *n = l.n;
    return SMELT_OK;
}

smelt_status hub_link_snapshot(const char *repo_dir, const char *commit, const char *relpath,
                               const char *etag, struct err *e) {
    if (!hub_is_hex(commit, 40) || !hub_valid_relpath(relpath) ||
        !(hub_is_hex(etag, 64) || hub_is_hex(etag, 40)))
        return err_set(e, SMELT_ERR_INVALID, "bad snapshot entry %s/%s -> %s", commit, relpath, etag);
    char path[HUB_PATH_MAX];
    int w = snprintf(path, sizeof path, "%s/snapshots/%s", repo_dir, commit);
    if (w < 0 || (size_t)w >= sizeof path) return err_set(e, SMELT_ERR_RANGE, "path too long");
    smelt_status st = hub_mkdirs(path, e);
    if (st) return st;
    /* the directories of relpath, one at a time, never through a symlink */
    char target[HUB_PATH_MAX] = "../../";
    size_t tl = strlen(target);
    const char *p = relpath;
    const char *slash;
    while ((slash = strchr(p, '/'))) {
        size_t len = (size_t)(slash - p);
        size_t pl = strlen(path);
        if (pl + 1 + len >= sizeof path || tl + 3 >= sizeof target)
            return err_set(e, SMELT_ERR_RANGE, "path too long");
        path[pl] = '/';
        memcpy(path + pl + 1, p, len);
        path[pl + 1 + len] = 0;
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return err_set(e, SMELT_ERR_IO, "cannot create %s: %s", path, strerror(errno));
        struct stat lst;
        if (lstat(path, &lst) != 0 || !S_ISDIR(lst.st_mode))
            return err_set(e, SMELT_ERR_IO, "%s is not a plain directory (a symlink?): refusing "
                           "to write through it", path);
        memcpy(target + tl, "../", 4);
        tl += 3;
        p = slash + 1;
    }
    size_t pl = strlen(path);
    w = snprintf(path + pl, sizeof path - pl, "/%s", p);
    if (w < 0 || (size_t)w >= sizeof path - pl) return err_set(e, SMELT_ERR_RANGE, "path too long");
    w = snprintf(target + tl, sizeof target - tl, "blobs/%s", etag);
    if (w < 0 || (size_t)w >= sizeof target - tl) return err_set(e, SMELT_ERR_RANGE, "path too long");

    char cur[HUB_PATH_MAX];
    ssize_t cl = readlink(path, cur, sizeof cur - 1);
    if (cl >= 0) {
        cur[cl] = 0;
        if (!strcmp(cur, target)) return SMELT_OK;
    }
    if (symlink(target, path) == 0) return SMELT_OK;
    if (errno != EEXIST)
        return err_set(e, SMELT_ERR_IO, "cannot create symlink %s: %s", path, strerror(errno));
    /* replace what is there (a stale link or a copied file) atomically */
    char tmp[HUB_PATH_MAX];
    w = snprintf(tmp, sizeof tmp, "%s.%ld.tmplink", path, (long)getpid());
    if (w < 0 || (size_t)w >= sizeof tmp) return err_set(e, SMELT_ERR_RANGE, "path too long");
    unlink(tmp);
    if (symlink(target, tmp) != 0 || rename(tmp, path) != 0) {
        int er = errno;
        unlink(tmp);
        return err_set(e, SMELT_ERR_IO, "cannot replace %s: %s", path, strerror(er));
    }
    return SMELT_OK;
}

int hub_lock(const char *cache, const char *repo, const char *etag, struct err *e) {
    char dir[HUB_PATH_MAX], path[HUB_PATH_MAX];
    char locks[HUB_PATH_MAX];
    int w = snprintf(locks, sizeof locks, "%s/.locks", cache);
    if (w < 0 || (size_t)w >= sizeof locks) {
        err_set(e, SMELT_ERR_RANGE, "path too long");
        return -1;
    }
    if (hub_repo_dir(locks, repo, dir, sizeof dir, e) != SMELT_OK) return -1;
    if (hub_mkdirs(dir, e) != SMELT_OK) return -1;
    w = snprintf(path, sizeof path, "%s/%s.lock", dir, etag);
    if (w < 0 || (size_t)w >= sizeof path) {
        err_set(e, SMELT_ERR_RANGE, "path too long");
        return -1;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0664);
    if (fd < 0) {
        err_set(e, SMELT_ERR_IO, "cannot open lock %s: %s", path, strerror(errno));
        return -1;
    }
    time_t start = time(NULL), last = start;
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK && errno != EINTR) {
            /* a file system without flock: go on unlocked, as huggingface_hub's soft lock
             * fallback would; the rename into place keeps the cache consistent anyway */
            log_debug("flock %s: %s; continuing without the lock", path, strerror(errno));
            return fd;
        }
        time_t now = time(NULL);
        if (now - last >= 10) {
            log_info("waiting for another download of %s (lock %s, %lds)", etag, path,
                     (long)(now - start));
            last = now;
        }
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return fd;
}

void hub_unlock(int fd) {
    if (fd >= 0) {
        flock(fd, LOCK_UN);
        close(fd);
    }
}

void hub_cachedir_tag(const char *cache) {
    char path[HUB_PATH_MAX];
    int w = snprintf(path, sizeof path, "%s/CACHEDIR.TAG", cache);
    if (w < 0 || (size_t)w >= sizeof path) return;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return;
    static const char tag[] = "Signature: 8a477f597d28d172789f06886806bc55\n"
                              "# This file is a cache directory tag created by smelt.\n"
                              "# For information about cache directory tags, see:\n"
                              "#\thttps://bford.info/cachedir/\n";
    ssize_t wr = write(fd, tag, sizeof tag - 1);
    (void)wr;
    close(fd);
}

smelt_status hub_find_in_dir(const char *dir, const char *quant, char *path, size_t n,
                             struct err *e) {
    char **names;
    size_t nn, *idx = NULL, ni = 0;
    smelt_status st = hub_list_files(dir, &names, &nn, e);
    if (st) return st;
    st = hub_select((const char *const *)names, nn, quant, &idx, &ni, e);
    if (st == SMELT_OK) {
        size_t dl = strlen(dir);
        while (dl > 1 && dir[dl - 1] == '/') dl--;
        int w = snprintf(path, n, "%.*s/%s", (int)dl, dir, names[idx[0]]);
        if (w < 0 || (size_t)w >= n) st = err_set(e, SMELT_ERR_RANGE, "path too long");
    } else {
        err_prefix(e, "directory %s", dir);
    }
    free(idx);
    hub_free_names(names, nn);
    return st;
}
