/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target for the guest memory table (src/core/mem.c): builds tables
 * from fuzzed region lists over two memfds, runs fuzzed GPA/UVA lookups,
 * iovec translations and ADD/REM_MEM_REG steps, and checks every answer
 * against a brute-force model, touching every byte range handed back.
 */
#ifndef _GNU_SOURCE
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#endif
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/mem.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/*
 * Input format: a byte stream read front to back; once it runs out every
 * read returns 0. First a count byte (0xff asks for VHD_MEM_MAX_REGIONS + 1
 * all-zero regions), then that many regions (see read_desc), then operations
 * (one opcode byte each, see LLVMFuzzerTestOneInput) until the input ends.
 */

#define NFILES     2
#define MAX_MODEL  32 /* regions the model tracks; adds beyond it are skipped */
#define MAX_IOV    16 /* largest iovec array handed to vhd_mem_gpa_to_iov */
#define MAX_OPS    64 /* operations per input, to keep executions fast */
#define NEW_MAX_N  12 /* regions in the initial list (besides the 0xff case) */
#define MEM_OFFMAX ((uint64_t)INT64_MAX)

/* Two memfds made once: sizes in pages, the second one ends mid-page. */
static int file_fd[NFILES];
static uint64_t file_size[NFILES];
static uint8_t *file_map[NFILES]; /* our own ("driver") mapping of each file */
static uint64_t pg;

/* One region the model believes is in the table. */
struct model_region {
    struct vhd_mem_region_desc d;
    int file; /* index into file_*, or -1 for an invalid fd */
};

struct model {
    uint32_t n;
    struct model_region r[MAX_MODEL];
};

struct reader {
    const uint8_t *p;
    size_t left;
};

static void die(void)
{
    __builtin_trap();
}

#define CHECK(c)   \
    do {           \
        if (!(c))  \
            die(); \
    } while (0)

static void files_init(void)
{
    if (pg)
        return;
    pg = (uint64_t)sysconf(_SC_PAGESIZE);
    file_size[0] = 16 * pg;
    file_size[1] = 5 * pg + 123;
    for (int i = 0; i < NFILES; i++) {
        file_fd[i] = memfd_create("fuzz-mem", MFD_CLOEXEC);
        if (file_fd[i] < 0 || ftruncate(file_fd[i], (off_t)file_size[i]) < 0)
            abort();
        uint64_t maplen = (file_size[i] + pg - 1) / pg * pg;
        void *p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, file_fd[i], 0);
        if (p == MAP_FAILED)
            abort();
        file_map[i] = p;
    }
}

static uint64_t rd(struct reader *rd_, unsigned bytes)
{
    uint64_t v = 0;

    for (unsigned i = 0; i < bytes; i++) {
        v <<= 8;
        if (rd_->left) {
            v |= *rd_->p++;
            rd_->left--;
        }
    }
    return v;
}

/* An interesting 64-bit value: small, page-ish, near the top, or raw. */
static uint64_t rd_value(struct reader *r, uint64_t small_max)
{
    switch (rd(r, 1) % 5) {
    case 0:
        return rd(r, 1) % (small_max + 1);
    case 1:
        return (rd(r, 1) % 64) * pg;
    case 2:
        return UINT64_MAX - rd(r, 2);
    case 3:
        return rd(r, 2) % (small_max + 1);
    default:
        return rd(r, 8);
    }
}

/* A region description; model->r[..] are used to make neighbours likely. */
static void read_desc(struct reader *r, const struct model *m, struct model_region *out)
{
    uint8_t sel = (uint8_t)rd(r, 1);
    int file = (sel & 7) == 7 ? -1 : (sel & 1);
    struct vhd_mem_region_desc *d = &out->d;
    const struct model_region *near = m->n ? &m->r[rd(r, 1) % m->n] : NULL;

    out->file = file;
    d->fd = file < 0 ? -1 : file_fd[file];
    /* size: a few pages, a few bytes, or anything */
    switch (rd(r, 1) % 4) {
    case 0:
        d->size = (1 + rd(r, 1) % 8) * pg;
        break;
    case 1:
        d->size = rd(r, 2) % (3 * pg);
        break;
    case 2:
        d->size = rd(r, 1);
        break;
    default:
        d->size = rd_value(r, 16 * pg);
        break;
    }
    /* gpa and uva: right after / before a known region, or a fresh value */
    uint8_t where = (uint8_t)rd(r, 1);
    if (near && (where & 3) == 0)
        d->gpa = near->d.gpa + near->d.size + (int8_t)rd(r, 1);
    else if (near && (where & 3) == 1)
        d->gpa = near->d.gpa - d->size + (int8_t)rd(r, 1);
    else
        d->gpa = rd_value(r, 1u << 20);
    if (near && (where & 12) == 0)
        d->uva = near->d.uva + near->d.size + (int8_t)rd(r, 1);
    else if (near && (where & 12) == 4)
        d->uva = near->d.uva - d->size;
    else
        d->uva = 0x7f0000000000 + rd_value(r, 1u << 20);
    /* offset: anywhere in (or just past) the file, at any alignment, or anything */
    if (rd(r, 1) % 4 != 3)
        d->mmap_offset = file >= 0 ? rd(r, 2) % (file_size[file] + 2) : rd(r, 2);
    else
        d->mmap_offset = rd_value(r, 32 * pg);
}

/* ---- the model: brute force over the regions it believes are mapped ---- */

static bool desc_valid(const struct vhd_mem_region_desc *d)
{
    return d->size > 0 && d->size <= UINT64_MAX - d->gpa && d->size <= UINT64_MAX - d->uva &&
           d->mmap_offset <= MEM_OFFMAX && d->size <= MEM_OFFMAX - d->mmap_offset;
}

static bool ranges_overlap(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
    return a <= b ? b - a < alen : a - b < blen;
}

/* The mapping errno the implementation reports for one valid desc, or 0. */
static int map_error(const struct model_region *mr)
{
    if (mr->file < 0)
        return -EBADF;
    uint64_t fs = file_size[mr->file];
    if (mr->d.mmap_offset > fs || mr->d.size > fs - mr->d.mmap_offset)
        return -ENXIO;
    return 0;
}

/*
 * Expected result of building a table from all of m (the kept regions) plus
 * add[0..nadd): -EINVAL for any invalid or overlapping entry, then the first
 * mapping error of the new entries in order, else 0.
 */
static int model_build_rc(const struct model *m, const struct model_region *add, uint32_t nadd)
{
    if (nadd > VHD_MEM_MAX_REGIONS || m->n > VHD_MEM_MAX_REGIONS - nadd)
        return -EINVAL;
    for (uint32_t i = 0; i < nadd; i++) {
        const struct vhd_mem_region_desc *a = &add[i].d;
        if (!desc_valid(a))
            return -EINVAL;
        for (uint32_t j = 0; j < m->n; j++) {
            const struct vhd_mem_region_desc *b = &m->r[j].d;
            if (ranges_overlap(a->gpa, a->size, b->gpa, b->size) ||
                ranges_overlap(a->uva, a->size, b->uva, b->size))
                return -EINVAL;
        }
        for (uint32_t j = 0; j < i; j++) {
            const struct vhd_mem_region_desc *b = &add[j].d;
            if (desc_valid(b) && (ranges_overlap(a->gpa, a->size, b->gpa, b->size) ||
                                  ranges_overlap(a->uva, a->size, b->uva, b->size)))
                return -EINVAL;
        }
    }
    for (uint32_t i = 0; i < nadd; i++) {
        int rc = map_error(&add[i]);
        if (rc)
            return rc;
    }
    return 0;
}

/* The model region containing gpa (or uva when by_uva), or NULL. */
static const struct model_region *model_find(const struct model *m, uint64_t a, bool by_uva)
{
    for (uint32_t i = 0; i < m->n; i++) {
        uint64_t start = by_uva ? m->r[i].d.uva : m->r[i].d.gpa;
        if (a >= start && a - start < m->r[i].d.size)
            return &m->r[i];
    }
    return NULL;
}

/* The model's answer for [a, a+len) in one region: the region, else NULL. */
static const struct model_region *model_range(const struct model *m, uint64_t a, uint64_t len,
                                              bool by_uva)
{
    const struct model_region *mr = model_find(m, a, by_uva);
    if (!mr)
        return NULL;
    uint64_t off = a - (by_uva ? mr->d.uva : mr->d.gpa);
    return len <= mr->d.size - off ? mr : NULL;
}

/*
 * Touch the first and last byte of [p, p+len) (len 0: the first byte only),
 * which the model says is file offset foff of mr's file: what is written
 * through p must show through our own mapping of the file. ASan catches any
 * pointer outside the table's mappings.
 */
static void touch(uint8_t *p, uint64_t len, const struct model_region *mr, uint64_t off)
{
    volatile uint8_t *v = p;
    uint8_t *f = file_map[mr->file] + mr->d.mmap_offset + off;
    uint64_t last = len ? len - 1 : 0;

    for (int k = 0; k < 2; k++) {
        uint64_t i = k ? last : 0;
        uint8_t old = v[i];
        CHECK(old == f[i]);
        v[i] = (uint8_t)(old + 1);
        CHECK(f[i] == (uint8_t)(old + 1));
        v[i] = old;
    }
}

/* Full consistency check of a table against the model. */
static void check_table(const struct vhd_mem *mem, const struct model *m)
{
    CHECK(mem->nregions == m->n);
    for (uint32_t i = 0; i < mem->nregions; i++) {
        const struct vhd_mem_region *r = &mem->regions[i];
        CHECK(r->map && r->map->refs > 0);
        if (i) {
            CHECK(mem->regions[i - 1].gpa < r->gpa);
            CHECK(mem->regions[mem->by_uva[i - 1]].uva < mem->regions[mem->by_uva[i]].uva);
        }
        const struct model_region *mr = model_find(m, r->gpa, false);
        CHECK(mr && mr->d.gpa == r->gpa && mr->d.size == r->size && mr->d.uva == r->uva &&
              mr->d.mmap_offset == r->mmap_offset);
        touch(r->hva, r->size, mr, 0);
    }
}

/* A lookup address: near a region edge of the model, or any value. */
static uint64_t rd_addr(struct reader *r, const struct model *m, bool uva)
{
    uint8_t mode = (uint8_t)rd(r, 1);
    if (m->n && mode % 3 != 2) {
        const struct vhd_mem_region_desc *d = &m->r[rd(r, 1) % m->n].d;
        uint64_t base = uva ? d->uva : d->gpa;
        if (mode % 3 == 1)
            base += d->size;
        return base + (uint64_t)(int64_t)(int16_t)rd(r, 2);
    }
    return uva ? 0x7f0000000000 + rd_value(r, 1u << 20) : rd_value(r, 1u << 20);
}

static uint64_t rd_len(struct reader *r)
{
    switch (rd(r, 1) % 4) {
    case 0:
        return rd(r, 1);
    case 1:
        return rd(r, 2);
    case 2:
        return (rd(r, 1) % 16) * pg + rd(r, 1) - 128;
    default:
        return rd_value(r, 64 * pg);
    }
}

/* ---- operations ---- */

static void op_gpa_to_hva(struct reader *r, const struct vhd_mem *mem, const struct model *m,
                          uint32_t *hint)
{
    uint64_t gpa = rd_addr(r, m, false), len = rd_len(r);
    uint8_t *p = vhd_mem_gpa_to_hva(mem, gpa, len, hint);
    const struct model_region *mr = model_range(m, gpa, len, false);

    if (!mr) {
        CHECK(p == NULL);
        return;
    }
    CHECK(p != NULL);
    CHECK(*hint < mem->nregions && mem->regions[*hint].gpa == mr->d.gpa);
    touch(p, len, mr, gpa - mr->d.gpa);
}

static void op_gpa_to_iov(struct reader *r, const struct vhd_mem *mem, const struct model *m,
                          uint32_t *hint)
{
    struct iovec iov[MAX_IOV];
    uint64_t gpa = rd_addr(r, m, false), len = rd_len(r);
    uint32_t max_iov = (uint32_t)(rd(r, 1) % (MAX_IOV + 1));
    uint32_t before = *hint;
    int n = vhd_mem_gpa_to_iov(mem, gpa, len, iov, max_iov, hint);

    /* model: walk region by region */
    int want;
    if (len == 0)
        want = 0;
    else if (len > UINT64_MAX - gpa)
        want = -EOVERFLOW;
    else {
        uint64_t a = gpa, left = len;
        int cnt = 0;
        want = 0;
        while (left) {
            const struct model_region *mr = model_find(m, a, false);
            if (!mr) {
                want = -EFAULT;
                break;
            }
            uint64_t seg = mr->d.size - (a - mr->d.gpa);
            if (seg > left)
                seg = left;
            cnt++;
            a += seg;
            left -= seg;
        }
        if (want == 0)
            want = cnt > (int)max_iov ? -ENOBUFS : cnt;
    }
    CHECK(n == want);
    if (n <= 0) {
        if (n < 0)
            CHECK(*hint == before);
        return;
    }
    uint64_t a = gpa, total = 0;
    for (int i = 0; i < n; i++) {
        const struct model_region *mr = model_find(m, a, false);
        CHECK(mr != NULL);
        CHECK(iov[i].iov_len > 0);
        touch(iov[i].iov_base, iov[i].iov_len, mr, a - mr->d.gpa);
        a += iov[i].iov_len;
        total += iov[i].iov_len;
    }
    CHECK(total == len);
    CHECK(*hint < mem->nregions);
}

static void op_uva_to_hva(struct reader *r, const struct vhd_mem *mem, const struct model *m)
{
    uint64_t uva = rd_addr(r, m, true), len = rd_len(r);
    uint8_t *p = vhd_mem_uva_to_hva(mem, uva, len);
    const struct model_region *mr = model_range(m, uva, len, true);

    if (!mr) {
        CHECK(p == NULL);
        return;
    }
    CHECK(p != NULL);
    touch(p, len, mr, uva - mr->d.uva);
}

static void op_region_of(struct reader *r, const struct vhd_mem *mem, const struct model *m,
                         uint32_t *hint)
{
    uint64_t gpa = rd_addr(r, m, false);
    const struct vhd_mem_region *reg = vhd_mem_region_of(mem, gpa);
    const struct model_region *mr = model_find(m, gpa, false);
    int i = vhd_mem__find_gpa(mem, gpa, hint);

    CHECK((reg == NULL) == (mr == NULL));
    CHECK((i < 0) == (mr == NULL));
    if (mr) {
        CHECK(reg->gpa == mr->d.gpa && &mem->regions[i] == reg && *hint == (uint32_t)i);
        touch(reg->hva + (gpa - reg->gpa), 1, mr, gpa - reg->gpa);
    }
}

/* ADD_MEM_REG: the new table must be right and the old one untouched until freed. */
static void op_add(struct reader *r, struct vhd_mem **mem, struct model *m)
{
    struct model_region add;
    struct vhd_mem *next = NULL;

    read_desc(r, m, &add);
    if (m->n == MAX_MODEL)
        return;
    int want = model_build_rc(m, &add, 1);
    int rc = vhd_mem_add(*mem, &add.d, &next);
    CHECK(rc == want);
    if (rc < 0) {
        CHECK(next == NULL);
        return;
    }
    check_table(*mem, m); /* the old table still works */
    vhd_mem_free(*mem);
    *mem = next;
    m->r[m->n++] = add;
    check_table(*mem, m);
}

/* REM_MEM_REG of a model region (exact, or with one field off by one). */
static void op_remove(struct reader *r, struct vhd_mem **mem, struct model *m)
{
    uint8_t sel = (uint8_t)rd(r, 1);
    struct vhd_mem *next = NULL;
    uint64_t gpa, size, uva;
    uint32_t k = m->n ? (uint32_t)(rd(r, 1) % m->n) : 0;

    if (m->n) {
        gpa = m->r[k].d.gpa + ((sel & 3) == 1);
        size = m->r[k].d.size - ((sel & 3) == 2);
        uva = m->r[k].d.uva + ((sel & 3) == 3);
    } else {
        gpa = rd_value(r, 1u << 20);
        size = rd_value(r, 1u << 20);
        uva = rd_value(r, 1u << 20);
    }
    bool exists = false;
    for (uint32_t i = 0; i < m->n; i++) {
        if (m->r[i].d.gpa == gpa && m->r[i].d.size == size && m->r[i].d.uva == uva) {
            exists = true;
            k = i;
        }
    }
    int rc = vhd_mem_remove(*mem, gpa, size, uva, &next);
    CHECK(rc == (exists ? 0 : -ENOENT));
    if (rc < 0)
        return;
    check_table(*mem, m);
    vhd_mem_free(*mem);
    *mem = next;
    m->r[k] = m->r[--m->n];
    check_table(*mem, m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct vhd_mem_region_desc descs[VHD_MEM_MAX_REGIONS + 1];
    struct reader r = {data, size};
    struct model m = {0};
    struct vhd_mem *mem = NULL;
    uint32_t n, hint;
    int rc;

    files_init();
    uint8_t count = (uint8_t)rd(&r, 1);
    if (count == 0xff) {
        /* one more than the cap, otherwise valid-looking: refused up front */
        for (uint32_t i = 0; i <= VHD_MEM_MAX_REGIONS; i++) {
            descs[i] = (struct vhd_mem_region_desc){
                .gpa = i * pg, .size = pg, .uva = i * pg, .mmap_offset = 0, .fd = file_fd[0]};
        }
        CHECK(vhd_mem_new(descs, VHD_MEM_MAX_REGIONS + 1, &mem) == -EINVAL);
        CHECK(mem == NULL);
        return 0;
    }
    /* the initial list; each entry may be placed next to one read before it */
    n = count % (NEW_MAX_N + 1);
    for (m.n = 0; m.n < n; m.n++) {
        read_desc(&r, &m, &m.r[m.n]);
        descs[m.n] = m.r[m.n].d;
    }
    struct model empty = {0};
    rc = vhd_mem_new(descs, n, &mem);
    CHECK(rc == model_build_rc(&empty, m.r, n));
    if (rc < 0) {
        CHECK(mem == NULL);
        return 0;
    }
    check_table(mem, &m);

    hint = (uint32_t)rd(&r, 4);
    for (int ops = 0; ops < MAX_OPS && r.left; ops++) {
        switch (rd(&r, 1) % 8) {
        case 0:
        case 1:
            op_gpa_to_hva(&r, mem, &m, &hint);
            break;
        case 2:
        case 3:
            op_gpa_to_iov(&r, mem, &m, &hint);
            break;
        case 4:
            op_uva_to_hva(&r, mem, &m);
            break;
        case 5:
            op_region_of(&r, mem, &m, &hint);
            break;
        case 6:
            op_add(&r, &mem, &m);
            break;
        default:
            if (rd(&r, 1) & 1)
                hint = (uint32_t)rd(&r, 4); /* arbitrary (stale, garbage) hint */
            else
                op_remove(&r, &mem, &m);
            break;
        }
    }
    vhd_mem_free(mem);
    return 0;
}
