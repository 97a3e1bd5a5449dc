/* KV block bookkeeping (engine/kv.h): pool accounting, block tables growing and
 * shrinking, exhaustion taking nothing, recycling order, a randomized run of many
 * sequences checked against a simple model of who owns which block, and the recurrent
 * state slots with their snapshots. */
#include <stdlib.h>
#include <string.h>

#include "engine/kv.h"
#include "t.h"

static void test_pool_init(void) {
    struct kv_pool p;
    struct err e;
    T_EQ_INT(kv_pool_init(&p, 0, 16, &e), SMELT_ERR_INVALID);
    T_EQ_INT(kv_pool_init(&p, 8, 0, &e), SMELT_ERR_INVALID);
    T_EQ_INT(kv_pool_init(&p, 8, 16, &e), SMELT_OK);
    T_EQ_INT(p.n_free, 8);
    T_EQ_INT(kv_blocks_for(&p, 0), 0);
    T_EQ_INT(kv_blocks_for(&p, 1), 1);
    T_EQ_INT(kv_blocks_for(&p, 16), 1);
    T_EQ_INT(kv_blocks_for(&p, 17), 2);
    kv_pool_free(&p);
}

static void test_reserve_truncate_release(void) {
    struct kv_pool p;
    struct err e;
    T_EQ_INT(kv_pool_init(&p, 10, 4, &e), SMELT_OK);
    struct kv_seq a, b;
    kv_seq_init(&a);
    kv_seq_init(&b);
    T_EQ_INT(kv_seq_reserve(&p, &a, 9, &e), SMELT_OK); /* 3 blocks */
    T_EQ_INT(a.n_blocks, 3);
    T_EQ_INT(p.n_free, 7);
    for (int i = 0; i < 3; i++) T_EQ_INT(a.blocks[i], i); /* a fresh pool hands out 0, 1, 2 */
    T_EQ_INT(kv_seq_reserve(&p, &a, 12, &e), SMELT_OK);  /* still 3 */
    T_EQ_INT(a.n_blocks, 3);
    T_EQ_INT(kv_seq_reserve(&p, &a, 13, &e), SMELT_OK);  /* 4 */
    T_EQ_INT(a.n_blocks, 4);
    T_EQ_INT(p.n_free, 6);

    /* exhaustion: nothing is taken */
    T_EQ_INT(kv_seq_reserve(&p, &b, 4 * 7, &e), SMELT_ERR_RANGE);
    T_CHECK(strstr(e.msg, "KV cache full") != NULL);
    T_EQ_INT(b.n_blocks, 0);
    T_EQ_INT(p.n_free, 6);
    T_EQ_INT(kv_seq_reserve(&p, &b, 4 * 6, &e), SMELT_OK); /* exactly what is left */
    T_EQ_INT(p.n_free, 0);

    /* truncate (rollback) returns whole blocks only; the last one freed is reused first */
    kv_seq_truncate(&p, &a, 5); /* keeps 2 blocks */
    T_EQ_INT(a.n_blocks, 2);
    T_EQ_INT(p.n_free, 2);
    kv_seq_truncate(&p, &a, 8); /* no growth */
    T_EQ_INT(a.n_blocks, 2);
    struct kv_seq c;
    kv_seq_init(&c);
    T_EQ_INT(kv_seq_reserve(&p, &c, 1, &e), SMELT_OK);
    T_EQ_INT(c.blocks[0], 2); /* a's blocks 3 then 2 were freed: 2 is on top */
    kv_seq_release(&p, &a);
    kv_seq_release(&p, &b);
    kv_seq_release(&p, &c);
    T_EQ_INT(p.n_free, 10);
    T_CHECK(a.blocks == NULL && a.n_blocks == 0);
    for (int i = 0; i < 10; i++) T_EQ_INT(p.ref[i], 0);
    kv_pool_free(&p);
}

/* Many sequences growing, rolling back and ending at random: no block is ever owned by
 * two sequences, and the free count always equals the blocks nobody owns. */
static void test_random(void) {
    enum { NB = 64, NS = 9, BS = 8 };
    struct kv_pool p;
    struct err e;
    T_EQ_INT(kv_pool_init(&p, NB, BS, &e), SMELT_OK);
    struct kv_seq s[NS];
    int len[NS] = {0};
    for (int i = 0; i < NS; i++) kv_seq_init(&s[i]);
    unsigned long long rng = 42;
    int full = 0;
    for (int step = 0; step < 5000; step++) {
        int i = (int)(t_rand_u64(&rng) % NS), op = (int)(t_rand_u64(&rng) % 10);
        if (op < 6) {
            int want = len[i] + 1 + (int)(t_rand_u64(&rng) % 20);
            smelt_status st = kv_seq_reserve(&p, &s[i], want, &e);
            if (st == SMELT_OK) len[i] = want;
            else full++;
        } else if (op < 9) {
            len[i] = len[i] ? (int)(t_rand_u64(&rng) % (unsigned)len[i]) : 0;
            kv_seq_truncate(&p, &s[i], len[i]);
        } else {
            kv_seq_release(&p, &s[i]);
            len[i] = 0;
        }
        int owner[NB], owned = 0;
        for (int b = 0; b < NB; b++) owner[b] = -1;
        for (int k = 0; k < NS; k++) {
            T_EQ_INT(s[k].n_blocks, kv_blocks_for(&p, len[k]));
            for (int j = 0; j < s[k].n_blocks; j++) {
                int b = s[k].blocks[j];
                T_CHECK(b >= 0 && b < NB && owner[b] == -1);
                if (b >= 0 && b < NB) owner[b] = k;
                owned++;
            }
        }
        T_EQ_INT(p.n_free, NB - owned);
        if (t_cur_fail_) break;
    }
    T_CHECK(full > 0); /* the pool did run out at times */
    for (int i = 0; i < NS; i++) kv_seq_release(&p, &s[i]);
    T_EQ_INT(p.n_free, NB);
    kv_pool_free(&p);
}

/* Recurrent state slots: live slots taken and returned with the sequence, snapshots at
 * block boundaries (kept + two trailing per sequence), cached with their blocks, a prefix
 * hit trimmed to the last snapshot, idle snapshots evicted for live slots, the live
 * reserve respected, rollback to the newest snapshot. */
static void test_slots(void) {
    struct kv_pool p;
    struct err e;
    struct kv_stats st;
    T_EQ_INT(kv_pool_init(&p, 12, 4, &e), SMELT_OK);
    T_EQ_INT(kv_prefix_enable(&p, &e), SMELT_OK);
    T_EQ_INT(kv_slots_enable(&p, 2, 3, &e), SMELT_ERR_INVALID);
    T_EQ_INT(kv_slots_enable(&p, 5, 2, &e), SMELT_OK);
    int32_t tok[40];
    for (int i = 0; i < 40; i++) tok[i] = 100 + i;
    struct kv_seq a, b;
    kv_seq_init(&a);
    kv_seq_init(&b);
    T_EQ_INT(kv_seq_reserve(&p, &a, 9, &e), SMELT_OK);
    T_CHECK(a.slot >= 0);
    struct batch_seq v = kv_seq_step(&p, &a, 0, 9, true); /* boundary 8: kept */
    T_EQ_INT(v.snap_pos, 8);
    T_CHECK(v.snap_slot >= 0 && v.snap_slot != a.slot);
    T_EQ_INT(a.snap_keep, 1);
    v = kv_seq_step(&p, &a, 9, 10, false); /* no boundary in (9, 10] */
    T_EQ_INT(v.snap_pos, 0);
    T_EQ_INT(kv_seq_reserve(&p, &a, 21, &e), SMELT_OK);
    T_EQ_INT(kv_seq_step(&p, &a, 10, 13, false).snap_pos, 12);
    T_EQ_INT(kv_seq_step(&p, &a, 13, 17, false).snap_pos, 16);
    kv_pool_stats(&p, &st);
    T_EQ_INT(st.live_slots, 1);
    T_EQ_INT(st.snapshots, 3);
    /* a third trailing one replaces the oldest (12); kept 8 stays. Free slots: 1, the
     * live reserve (2 - 1 live) takes it: no snapshot at 20 */
    T_EQ_INT(kv_seq_step(&p, &a, 17, 21, false).snap_pos, 0);
    /* cache a's blocks, release it: its snapshots (8, 12, 16) park with their blocks */
    uint64_t h[8], parent = 0;
    for (int bl = 0; bl < 5; bl++) {
        h[bl] = kv_block_hash(&p, parent, tok + bl * 4);
        kv_prefix_register(&p, a.blocks[bl], h[bl], parent, tok + bl * 4);
        parent = h[bl];
    }
    kv_seq_release(&p, &a);
    kv_pool_stats(&p, &st);
    T_EQ_INT(st.live_slots, 0);
    T_EQ_INT(st.idle_snapshots, 3);
    /* a hit on all 5 blocks resumes at the last snapshot (16): 4 blocks */
    T_EQ_INT(kv_prefix_acquire(&p, &b, tok, 5, h), 4);
    T_CHECK(b.restore >= 0);
    int32_t restore = b.restore;
    T_EQ_INT(kv_seq_reserve(&p, &b, 30, &e), SMELT_OK);
    T_CHECK(b.slot >= 0 && b.slot != restore);
    kv_pool_stats(&p, &st);
    T_EQ_INT(st.idle_snapshots, 0); /* b references the blocks of 8, 12 and 16 now */
    T_EQ_INT(st.snapshots, 3);
    /* rollback to 14: 16's snapshot is past it; the newest at or before 14 is 12 */
    int32_t from = -1;
    kv_seq_rollback(&p, &b, 14, &from);
    T_EQ_INT(from, 12);
    T_CHECK(b.restore >= 0);
    kv_seq_rollback(&p, &b, 3, &from);
    T_EQ_INT(from, 0);
    T_EQ_INT(b.restore, -1);
    kv_seq_release(&p, &b);
    kv_pool_stats(&p, &st);
    T_EQ_INT(st.live_slots, 0);
    T_EQ_INT(p.slots ? st.n_slots : 0, 5);
    kv_pool_free(&p);
}

int main(void) {
    T_RUN(test_pool_init);
    T_RUN(test_slots);
    T_RUN(test_reserve_truncate_release);
    T_RUN(test_random);
    return t_done();
}
