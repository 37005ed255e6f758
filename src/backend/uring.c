/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The io_uring block backend: a regular file or a block device, buffered by
 * default or O_DIRECT, driven through the io_uring of the worker that
 * submits each operation (one ring per worker, never shared). Short
 * transfers are resubmitted; discard and write-zeroes use fallocate with
 * fallbacks learned at run time. Images are locked the way QEMU locks them
 * (image_lock), so QEMU, qemu-storage-daemon and another vhostd see us.
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "blk_backend.h"
#include "util/compiler.h"
#include "util/iov.h"
#include "runtime/log.h"
#include "util/errmsg.h"

/*
 * -EAGAIN / -EINTR from a CQE are retried this many times per operation
 * before the operation fails; io_uring normally absorbs both itself, so this
 * only bounds a pathological loop.
 */
#define URING_MAX_RETRIES 8

/*
 * Write-zeroes fallback: zeroes are written from this buffer in chunks of its
 * size. 1 MiB keeps the number of SQEs per GiB low; it lives in .bss and is
 * never written, so it costs no memory beyond the shared zero page. Aligned
 * for O_DIRECT.
 */
#define URING_ZERO_CHUNK (1u << 20)
static uint8_t uring_zero_buf[URING_ZERO_CHUNK] __attribute__((aligned(4096)));

/*
 * O_DIRECT bounce buffer for misaligned guest buffers: requests are bounced
 * in chunks of at most this size, so a guest cannot make us allocate more
 * than 256 KiB per request in flight (its queues bound those).
 */
#define URING_BOUNCE_CHUNK (256u << 10)

/* Write-zeroes methods, tried in this order (io->stage). */
enum {
    WZ_PUNCH,      /* fallocate(PUNCH_HOLE | KEEP_SIZE), only with VHD_BLK_IO_F_UNMAP */
    WZ_ZERO_RANGE, /* fallocate(ZERO_RANGE | KEEP_SIZE) */
    WZ_WRITE,      /* write zeroes from uring_zero_buf */
};

struct uring_be {
    struct vhd_blk_backend be; /* first: the common head */
    int fd;
    bool blkdev;            /* a block device (else a regular file) */
    bool direct;            /* opened O_DIRECT */
    uint32_t dio_mem_align; /* O_DIRECT: buffer address alignment */
    uint32_t dio_len_align; /* O_DIRECT: offset and segment length alignment */
    /*
     * Capabilities learned from -EOPNOTSUPP at run time. Several workers may
     * store them; they are single bytes written with relaxed atomic stores
     * (no read-modify-write), and a stale read only costs one more try.
     */
    uint8_t no_punch;      /* fallocate PUNCH_HOLE unsupported */
    uint8_t no_zero_range; /* fallocate ZERO_RANGE unsupported */
    uint8_t no_blkdiscard; /* BLKDISCARD unsupported (block devices) */
    /*
     * Buffered image: the first failed flush (-errno), 0 while none failed.
     * Linux reports a writeback error to one fsync and may then mark the
     * pages clean: a later fsync succeeds without the data being on disk.
     * So once a flush failed every later one fails with the same error (as
     * QEMU does): a FLUSH never says "durable" when it may not be. Stored
     * once with a relaxed atomic; O_DIRECT images never set it.
     */
    int flush_err;
};

static struct uring_be *to_ub(struct vhd_blk_backend *be)
{
    return vhd_container_of(be, struct uring_be, be);
}

static bool flag_get(const uint8_t *f)
{
    return __atomic_load_n(f, __ATOMIC_RELAXED) != 0;
}

static void flag_set(uint8_t *f)
{
    __atomic_store_n(f, 1, __ATOMIC_RELAXED);
}

static bool is_pow2(uint64_t v)
{
    return v && !(v & (v - 1));
}

/* O_DIRECT alignment of fd: statx(STATX_DIOALIGN) where the kernel has it (6.1+). */
static int dio_alignment(int fd, bool blkdev, uint32_t lbs, uint32_t *mem, uint32_t *len)
{
    *mem = blkdev && lbs ? lbs : 512;
    *len = blkdev && lbs ? lbs : 512;
#ifdef STATX_DIOALIGN
    struct statx stx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
        (stx.stx_mask & STATX_DIOALIGN)) {
        if (stx.stx_dio_offset_align == 0)
            return -EINVAL; /* the file system reports no O_DIRECT support for this file */
        *mem = stx.stx_dio_mem_align ? stx.stx_dio_mem_align : 1;
        *len = stx.stx_dio_offset_align;
    }
#else
    (void)fd;
#endif
    return 0;
}

/*
 * Image locking, compatible with QEMU's file driver (block/file-posix.c),
 * which qemu-io, qemu-img, qemu-storage-daemon and QEMU itself use. Every
 * user of an image holds shared (F_RDLCK) OFD locks on single bytes: byte
 * LOCK_PERM_BASE + n for each permission n it has, and byte
 * LOCK_SHARED_BASE + n for each permission n it does not let others have.
 * Permissions (QEMU 6.2 and later; 0x10 was "change children" before and
 * is no longer locked): 0 consistent read, 1 write, 2 write unchanged,
 * 3 resize. A user that starts takes its bytes and then checks the others'
 * (taking first: two users starting together both see each other):
 *   - for each permission n it wants, nobody else may hold byte
 *     LOCK_SHARED_BASE + n: else "Failed to get "<n>" lock";
 *   - for each permission n it does not share, nobody else may hold byte
 *     LOCK_PERM_BASE + n: else "Failed to get shared "<n>" lock".
 * vhostd wants consistent read, plus write when writable, and, like a QEMU
 * disk without share-rw, shares everything but write. So while it serves
 * an image, a writable qemu-io or qemu-storage-daemon export fails with
 * "Failed to get "write" lock", and vhostd refuses an image someone writes
 * to (or, when writable, one someone reads without sharing write). Readers
 * that share reads (a read-only vhostd, qemu-io -r) coexist. OFD locks
 * belong to the open file description: our own never conflict with each
 * other, and they go away when the fd closes (uring_close, or process exit).
 */
#define LOCK_PERM_BASE   100
#define LOCK_SHARED_BASE 200
enum { PERM_CONSISTENT_READ, PERM_WRITE, PERM_WRITE_UNCHANGED, PERM_RESIZE, PERM_COUNT };
static const char *const perm_names[PERM_COUNT] = {"consistent read", "write", "write unchanged",
                                                   "resize"};

/* Take a shared lock on byte off of fd (our open file description). 0 or -errno. */
static int lock_byte(int fd, off_t off, short type)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = off, .l_len = 1};
    return fcntl(fd, F_OFD_SETLK, &fl) < 0 ? -errno : 0;
}

/* Does another open file description hold a lock on byte off? 1, 0, or -errno. */
static int byte_taken(int fd, off_t off)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = off, .l_len = 1};
    if (fcntl(fd, F_OFD_GETLK, &fl) < 0)
        return -errno;
    return fl.l_type != F_UNLCK;
}

/*
 * Wait for a conflicting user to go away at most LOCK_WAIT_MS, looking every
 * LOCK_POLL_MS: long enough for a dead process's io_uring to let go of its
 * fd (tens of ms under load), short enough that a real conflict is refused
 * at once for a person.
 */
#define LOCK_WAIT_MS 2000u
#define LOCK_POLL_MS 10u

/*
 * Is there a user whose locks conflict with ours (perm, unshared)? 0 none;
 * -EBUSY with err naming the lock, in QEMU's words; -errno when the locks
 * cannot be tested.
 */
static int lock_conflict(int fd, unsigned perm, unsigned unshared, const char *image, char *err,
                         size_t errlen)
{
    for (int n = 0; n < PERM_COUNT; n++) {
        int t = 0;
        if (perm & (1u << n)) {
            t = byte_taken(fd, LOCK_SHARED_BASE + n);
            if (t > 0)
                return vhd_errf(err, errlen, -EBUSY,
                                "image %s: Failed to get \"%s\" lock: another process (QEMU, "
                                "qemu-storage-daemon, vhostd) uses it and does not share \"%s\" "
                                "(locking=off overrides)",
                                image, perm_names[n], perm_names[n]);
        }
        if (t == 0 && (unshared & (1u << n))) {
            t = byte_taken(fd, LOCK_PERM_BASE + n);
            if (t > 0)
                return vhd_errf(
                    err, errlen, -EBUSY,
                    "image %s: Failed to get shared \"%s\" lock: another process (QEMU, "
                    "qemu-storage-daemon, vhostd) has it open for \"%s\" "
                    "(locking=off overrides)",
                    image, perm_names[n], perm_names[n]);
        }
        if (t < 0)
            return t;
    }
    return 0;
}

/*
 * Lock fd (image path for messages) for a user that is writable unless ro.
 * 0; -EBUSY when another process holds a conflicting lock (err names it, in
 * QEMU's words); with VHD_BLK_LOCK_ON, -errno when the file system refuses
 * OFD locks (with AUTO that is a warning and no lock). The thread that opens
 * the device (it may wait LOCK_WAIT_MS here).
 */
static int image_lock(int fd, bool ro, enum vhd_blk_locking mode, const char *image, char *err,
                      size_t errlen)
{
    const unsigned perm = 1u << PERM_CONSISTENT_READ | (ro ? 0u : 1u << PERM_WRITE);
    const unsigned unshared = 1u << PERM_WRITE;
    int rc = 0;

    if (mode == VHD_BLK_LOCK_OFF)
        return 0;
    for (int n = 0; n < PERM_COUNT && rc == 0; n++) {
        if (perm & (1u << n))
            rc = lock_byte(fd, LOCK_PERM_BASE + n, F_RDLCK);
        if (rc == 0 && (unshared & (1u << n)))
            rc = lock_byte(fd, LOCK_SHARED_BASE + n, F_RDLCK);
        if (rc == -EAGAIN || rc == -EACCES) /* someone holds an exclusive lock there */
            return vhd_errf(
                err, errlen, -EBUSY,
                "image %s: Failed to lock byte %d: another process holds it exclusively "
                "(locking=off overrides)",
                image, (perm & (1u << n) ? LOCK_PERM_BASE : LOCK_SHARED_BASE) + n);
    }
    /*
     * A process that just died (a crash, kill -9, a restart) keeps its locks
     * until the kernel has dropped the last reference to its fd, which its
     * io_uring requests still in flight hold: their writes can land until
     * then, so its locks rightly outlive it a little. Wait for that, bounded.
     */
    unsigned waited = 0;
    while (rc == 0) {
        rc = lock_conflict(fd, perm, unshared, image, err, errlen);
        if (rc != -EBUSY || waited >= LOCK_WAIT_MS)
            break;
        rc = 0;
        usleep(LOCK_POLL_MS * 1000);
        waited += LOCK_POLL_MS;
    }
    if (rc == -EBUSY)
        return rc;
    if (rc == 0) {
        if (waited)
            vhd_log(VHD_LOG_INFO, "image %s: waited %u ms for a previous user's locks to go", image,
                    waited);
        return 0;
    }
    /* The file system refuses OFD locks (some network file systems): no lock can be held. */
    struct flock all = {.l_type = F_UNLCK,
                        .l_whence = SEEK_SET,
                        .l_start = LOCK_PERM_BASE,
                        .l_len = LOCK_SHARED_BASE + PERM_COUNT - LOCK_PERM_BASE};
    (void)fcntl(fd, F_OFD_SETLK, &all);
    if (mode == VHD_BLK_LOCK_ON)
        return vhd_errf(err, errlen, rc, "image %s: cannot lock it (locking=on): %s", image,
                        strerror(-rc));
    vhd_log(VHD_LOG_WARN, "image %s: file locks unsupported there (%s): served without locks",
            image, strerror(-rc));
    return 0;
}

static int uring_open(const struct vhd_blk_backend_opts *o, struct vhd_blk_backend **out, char *err,
                      size_t errlen)
{
    /*
     * O_NONBLOCK for the open only: a FIFO (or a device node that waits for
     * a partner) would otherwise block the opening thread in open(), holding
     * up every other device's messages; such files are refused below, and
     * the flag is cleared on what is kept.
     */
    int flags = (o->ro ? O_RDONLY : O_RDWR) | O_CLOEXEC | O_NONBLOCK | (o->direct ? O_DIRECT : 0);
    bool created = false;
    struct stat st;
    uint64_t size = 0;
    uint32_t lbs = 0, pbs = 0;
    int fd, rc;

    if (!o->image || !o->image[0])
        return vhd_errf(err, errlen, -EINVAL, "the uring backend needs an image path");

    fd = open(o->image, flags);
    if (fd < 0 && errno == ENOENT) {
        if (o->size == 0)
            return vhd_errf(err, errlen, -ENOENT,
                            "image %s does not exist (give a size to create a sparse one)",
                            o->image);
        if (o->ro)
            return vhd_errf(err, errlen, -ENOENT,
                            "image %s does not exist (a read-only image is not created)", o->image);
        fd = open(o->image, flags | O_CREAT | O_EXCL, 0644);
        created = fd >= 0;
    }
    if (fd < 0) {
        rc = -errno;
        if (rc == -EINVAL && o->direct)
            return vhd_errf(err, errlen, rc,
                            "cannot open image %s with O_DIRECT: not supported there", o->image);
        return vhd_errf(err, errlen, rc, "cannot open image %s: %s", o->image, strerror(-rc));
    }
    if (fstat(fd, &st) < 0) {
        rc = vhd_errf(err, errlen, -errno, "cannot stat image %s: %s", o->image, strerror(errno));
        goto err_close;
    }
    if (S_ISREG(st.st_mode)) {
        if (created && ftruncate(fd, (off_t)o->size) < 0) {
            rc = vhd_errf(err, errlen, -errno, "cannot size new image %s to %llu bytes: %s",
                          o->image, (unsigned long long)o->size, strerror(errno));
            goto err_close;
        }
        size = created ? o->size : (uint64_t)st.st_size;
        /* st_blksize (the file system's preferred I/O size) stands in for a physical block. */
        if (is_pow2((uint64_t)st.st_blksize) && (uint64_t)st.st_blksize >= o->block_size &&
            st.st_blksize <= 65536)
            pbs = (uint32_t)st.st_blksize;
    } else if (S_ISBLK(st.st_mode)) {
        int ssz = 0;
        unsigned int psz = 0;
        if (ioctl(fd, BLKGETSIZE64, &size) < 0) {
            rc = vhd_errf(err, errlen, -errno, "cannot get the size of block device %s: %s",
                          o->image, strerror(errno));
            goto err_close;
        }
        if (ioctl(fd, BLKSSZGET, &ssz) == 0 && ssz > 0)
            lbs = (uint32_t)ssz;
        if (ioctl(fd, BLKPBSZGET, &psz) == 0)
            pbs = psz;
    } else {
        rc = vhd_errf(err, errlen, -EINVAL, "image %s is neither a regular file nor a block device",
                      o->image);
        goto err_close;
    }
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0) {
        rc = vhd_errf(err, errlen, -errno, "image %s: fcntl: %s", o->image, strerror(errno));
        goto err_close;
    }
    rc = image_lock(fd, o->ro, o->locking, o->image, err, errlen);
    if (rc < 0)
        goto err_close;
    if (o->size && size != o->size) {
        rc = vhd_errf(
            err, errlen, -EINVAL,
            "image %s has %llu bytes, not the %llu requested (size= only sizes a new image)",
            o->image, (unsigned long long)size, (unsigned long long)o->size);
        goto err_close;
    }

    struct uring_be *ub = calloc(1, sizeof(*ub));
    if (!ub) {
        rc = vhd_errf(err, errlen, -ENOMEM, "out of memory");
        goto err_close;
    }
    ub->fd = fd;
    ub->blkdev = S_ISBLK(st.st_mode);
    ub->direct = o->direct;
    if (o->direct) {
        if (dio_alignment(fd, ub->blkdev, lbs, &ub->dio_mem_align, &ub->dio_len_align) < 0) {
            rc = vhd_errf(err, errlen, -EINVAL, "image %s does not support O_DIRECT", o->image);
            goto err_free;
        }
        if (ub->dio_len_align > o->block_size || !is_pow2(ub->dio_len_align) ||
            !is_pow2(ub->dio_mem_align)) {
            rc = vhd_errf(err, errlen, -EINVAL,
                          "block size %u is smaller than the O_DIRECT alignment %u of image %s",
                          o->block_size, ub->dio_len_align, o->image);
            goto err_free;
        }
    }
    ub->be.ops = &vhd_blk_backend_uring;
    ub->be.size = size;
    ub->be.phys_block_size = pbs;
    ub->be.ro = o->ro;
    /* Files: punch hole; block devices: fallocate punch = zero-out with unmap. */
    ub->be.zeroes_may_unmap = !o->ro;
    snprintf(ub->be.desc, sizeof(ub->be.desc), "uring %s%s%s", o->image,
             ub->blkdev ? " (block device)" : "", o->direct ? " (O_DIRECT)" : "");
    *out = &ub->be;
    return 0;

err_free:
    free(ub);
err_close:
    close(fd);
    if (created)
        unlink(o->image);
    return rc;
}

static void uring_close(struct vhd_blk_backend *be)
{
    struct uring_be *ub = to_ub(be);
    /* Shutdown: whatever a writeback cache still holds reaches the storage. */
    if (!be->ro && fdatasync(ub->fd) < 0)
        vhd_log(VHD_LOG_ERROR, "%s: fdatasync on close: %s", be->desc, strerror(errno));
    close(ub->fd);
    free(ub);
}

/* Put back the caller's iovec changed for a short-I/O resubmission (iov_seek). */
static void iov_restore(struct vhd_blk_io *io)
{
    if (io->cur_saved) {
        io->iov[io->cur] = io->biov;
        io->cur_saved = false;
    }
}

/*
 * Point the next submission at byte io->done of the caller's iovecs: from
 * iov[cur], whose front is cut off in place when the transfer stopped
 * inside it (its original is saved in biov and put back by iov_restore, so
 * the caller gets its array back unchanged, blk_backend.h).
 */
static void iov_seek(struct vhd_blk_io *io)
{
    uint64_t off = io->done;
    uint32_t k = 0;

    iov_restore(io);
    while (k < io->iovcnt && off >= io->iov[k].iov_len) {
        off -= io->iov[k].iov_len;
        k++;
    }
    io->cur = k;
    if (off && k < io->iovcnt) {
        io->biov = io->iov[k];
        io->cur_saved = true;
        io->iov[k].iov_base = (uint8_t *)io->iov[k].iov_base + off;
        io->iov[k].iov_len -= off;
    }
}

/* Complete io: give the caller its iovecs back, free the bounce buffer, call back. */
static void finish(struct vhd_blk_io *io, int res)
{
    iov_restore(io);
    if (io->bounce) {
        free(io->bounce);
        io->bounce = NULL;
    }
    io->complete(io, res);
}

/*
 * Next SQE of the worker's ring (vhd_worker_get_sqe submits queued SQEs to
 * make room when the SQ is full, and counts the SQE for the next submit).
 * NULL when the kernel cannot take more right now: the operation fails with
 * -EBUSY (the status becomes IOERR). Queues never have more requests in
 * flight than their ring size, so this needs an SQ far smaller than the sum
 * of the ring sizes plus a CQ overflow, and does not happen in practice.
 */
static struct io_uring_sqe *get_sqe(struct vhd_blk_io *io)
{
    return vhd_worker_get_sqe(io->worker);
}

static void queue_sqe(struct vhd_blk_io *io, struct io_uring_sqe *sqe)
{
    io_uring_sqe_set_data(sqe, &io->cb);
}

/*
 * The iovec array the next read/write uses: the zero buffer, the bounce
 * buffer (filled with the next chunk of guest data for a write), or the
 * caller's array.
 */
static struct iovec *rw_iov(struct vhd_blk_io *io, uint32_t *cnt)
{
    if (io->op == VHD_BLK_IO_WRITE_ZEROES) {
        *cnt = 1;
        return &io->biov;
    }
    if (io->bounce) {
        uint64_t left = io->len - io->done;
        io->biov.iov_base = io->bounce;
        io->biov.iov_len = left < URING_BOUNCE_CHUNK ? left : URING_BOUNCE_CHUNK;
        if (io->op == VHD_BLK_IO_WRITE)
            (void)vhd_iov_to_buf(io->iov, io->iovcnt, io->done, io->bounce, io->biov.iov_len);
        *cnt = 1;
        return &io->biov;
    }
    *cnt = io->iovcnt - io->cur;
    return io->iov + io->cur;
}

/* Issue (or reissue, after a short transfer) the read/write for the bytes not yet done. */
static void issue_rw(struct uring_be *ub, struct vhd_blk_io *io)
{
    struct io_uring_sqe *sqe = get_sqe(io);
    uint32_t cnt;

    if (vhd_unlikely(!sqe)) {
        finish(io, -EBUSY);
        return;
    }
    struct iovec *iov = rw_iov(io, &cnt);
    if (io->op == VHD_BLK_IO_READ) {
        io_uring_prep_readv(sqe, ub->fd, iov, cnt, io->offset + io->done);
    } else {
        int rwf = (io->flags & VHD_BLK_IO_F_DSYNC) ? RWF_DSYNC : 0;
        io_uring_prep_writev2(sqe, ub->fd, iov, cnt, io->offset + io->done, rwf);
    }
    queue_sqe(io, sqe);
}

static void issue_fallocate(struct uring_be *ub, struct vhd_blk_io *io, int mode)
{
    struct io_uring_sqe *sqe = get_sqe(io);
    if (vhd_unlikely(!sqe)) {
        finish(io, -EBUSY);
        return;
    }
    io_uring_prep_fallocate(sqe, ub->fd, mode, (off_t)io->offset, (off_t)io->len);
    queue_sqe(io, sqe);
}

/* Point biov at the next chunk of zeroes to write. */
static void zero_chunk(struct vhd_blk_io *io)
{
    uint64_t left = io->len - io->done;
    io->biov.iov_base = uring_zero_buf;
    io->biov.iov_len = left < URING_ZERO_CHUNK ? left : URING_ZERO_CHUNK;
}

/*
 * O_DIRECT needs every buffer address aligned to dio_mem_align and every
 * length to dio_len_align. Guest buffers from Linux are (its block layer
 * keeps 512-byte DMA alignment); others are bounced.
 */
static bool dio_aligned(const struct uring_be *ub, const struct vhd_blk_io *io)
{
    uintptr_t mmask = ub->dio_mem_align - 1, lmask = ub->dio_len_align - 1;
    for (uint32_t i = 0; i < io->iovcnt; i++)
        if (((uintptr_t)io->iov[i].iov_base & mmask) || (io->iov[i].iov_len & lmask))
            return false;
    return true;
}

static int bounce_setup(struct uring_be *ub, struct vhd_blk_io *io)
{
    size_t align = ub->dio_mem_align < 4096 ? 4096 : ub->dio_mem_align;
    size_t size = io->len < URING_BOUNCE_CHUNK ? io->len : URING_BOUNCE_CHUNK;
    void *p = NULL;

    if (posix_memalign(&p, align, size) != 0)
        return -ENOMEM;
    io->bounce = p;
    return 0;
}

/* Discard that fallocate could not do: BLKDISCARD on a block device, else nothing. */
static void discard_fallback(struct uring_be *ub, struct vhd_blk_io *io)
{
    if (ub->blkdev && !flag_get(&ub->no_blkdiscard)) {
        /*
         * Synchronous, on the worker: rare (a device that discards but
         * cannot zero-out with unmap), and bounded by max_discard_sectors.
         */
        uint64_t range[2] = {io->offset, io->len};
        if (ioctl(ub->fd, BLKDISCARD, range) < 0) {
            int e = errno;
            if (e == EOPNOTSUPP) {
                flag_set(&ub->no_blkdiscard);
            } else {
                finish(io, -e);
                return;
            }
        }
    }
    /* Discard is advisory (5.2.6.2: the device MAY deallocate): success either way. */
    finish(io, 0);
}

/* Try the current write-zeroes method, skipping those known not to work. */
static void wz_issue(struct uring_be *ub, struct vhd_blk_io *io)
{
    if (io->stage == WZ_PUNCH && (!(io->flags & VHD_BLK_IO_F_UNMAP) || flag_get(&ub->no_punch)))
        io->stage = WZ_ZERO_RANGE;
    if (io->stage == WZ_ZERO_RANGE && flag_get(&ub->no_zero_range))
        io->stage = WZ_WRITE;
    switch (io->stage) {
    case WZ_PUNCH:
        issue_fallocate(ub, io, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE);
        break;
    case WZ_ZERO_RANGE:
        issue_fallocate(ub, io, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE);
        break;
    default:
        io->done = 0;
        zero_chunk(io);
        issue_rw(ub, io);
        break;
    }
}

/* A read/write CQE (also the zero-writing stage of write zeroes). */
static void rw_done(struct uring_be *ub, struct vhd_blk_io *io, int res)
{
    if (res == -EAGAIN || res == -EINTR) {
        if (io->retries++ < URING_MAX_RETRIES) {
            issue_rw(ub, io);
            return;
        }
    }
    if (res < 0) {
        finish(io, res);
        return;
    }
    if (res == 0) {
        /* No progress: end of file (the image shrank under us) or a device that stalls. */
        finish(io, -EIO);
        return;
    }
    if ((uint64_t)res > io->len - io->done || (io->bounce && (uint64_t)res > io->biov.iov_len)) {
        finish(io, -EIO); /* more than asked: cannot happen; survive it */
        return;
    }
    if (io->bounce && io->op == VHD_BLK_IO_READ)
        (void)vhd_iov_from_buf(io->iov, io->iovcnt, io->done, io->bounce, (size_t)res);
    io->done += (uint64_t)res;
    if (io->done == io->len) {
        finish(io, 0);
        return;
    }
    /*
     * More to do: the next bounce or zero chunk, or the rest of a short
     * transfer (the caller's iovecs from io->done on; the bounce and zero
     * chunks are recomputed from io->done).
     */
    if (io->op == VHD_BLK_IO_WRITE_ZEROES)
        zero_chunk(io);
    else if (!io->bounce)
        iov_seek(io);
    issue_rw(ub, io);
}

static void uring_cqe(struct vhd_io_cb *cb, int res)
{
    struct vhd_blk_io *io = vhd_container_of(cb, struct vhd_blk_io, cb);
    struct uring_be *ub = to_ub(io->be);

    switch (io->op) {
    case VHD_BLK_IO_READ:
    case VHD_BLK_IO_WRITE:
        rw_done(ub, io, res);
        return;
    case VHD_BLK_IO_FLUSH:
        if (res < 0 && !ub->direct && __atomic_load_n(&ub->flush_err, __ATOMIC_RELAXED) == 0) {
            __atomic_store_n(&ub->flush_err, res, __ATOMIC_RELAXED);
            vhd_log(VHD_LOG_ERROR,
                    "%s: flush failed (%s): the page cache may have dropped the data, every "
                    "later flush fails too",
                    ub->be.desc, strerror(-res));
        }
        finish(io, res < 0 ? res : 0);
        return;
    case VHD_BLK_IO_DISCARD:
        if (res == -EOPNOTSUPP) {
            if (!flag_get(&ub->no_punch))
                vhd_log(VHD_LOG_INFO, "%s: hole punching unsupported, discard %s", ub->be.desc,
                        ub->blkdev ? "uses BLKDISCARD" : "does nothing");
            flag_set(&ub->no_punch);
            discard_fallback(ub, io);
            return;
        }
        finish(io, res < 0 ? res : 0);
        return;
    case VHD_BLK_IO_WRITE_ZEROES:
        if (io->stage == WZ_WRITE) {
            rw_done(ub, io, res);
            return;
        }
        if (res == -EOPNOTSUPP) {
            if (io->stage == WZ_PUNCH) {
                flag_set(&ub->no_punch);
            } else {
                if (!flag_get(&ub->no_zero_range))
                    vhd_log(VHD_LOG_INFO, "%s: FALLOC_FL_ZERO_RANGE unsupported, writing zeroes",
                            ub->be.desc);
                flag_set(&ub->no_zero_range);
            }
            io->stage++;
            wz_issue(ub, io);
            return;
        }
        finish(io, res < 0 ? res : 0);
        return;
    default:
        finish(io, -EOPNOTSUPP);
        return;
    }
}

static void uring_submit(struct vhd_blk_backend *be, struct vhd_worker *w, struct vhd_blk_io *io)
{
    struct uring_be *ub = to_ub(be);
    struct io_uring_sqe *sqe;

    io->be = be;
    io->worker = w;
    io->done = 0;
    io->bounce = NULL;
    io->retries = 0;
    io->stage = WZ_PUNCH;
    io->cur = 0;
    io->cur_saved = false;
    io->cb.done = uring_cqe;
    if (vhd_unlikely(!w)) {
        finish(io, -EINVAL); /* not on a worker: cannot happen; survive it */
        return;
    }
    if (io->op != VHD_BLK_IO_READ && io->op != VHD_BLK_IO_FLUSH && be->ro) {
        finish(io, -EROFS);
        return;
    }

    switch (io->op) {
    case VHD_BLK_IO_READ:
    case VHD_BLK_IO_WRITE:
        if (io->len == 0) {
            finish(io, 0);
            return;
        }
        if (ub->direct && !dio_aligned(ub, io)) {
            int rc = bounce_setup(ub, io);
            if (rc < 0) {
                finish(io, rc);
                return;
            }
        }
        issue_rw(ub, io);
        return;
    case VHD_BLK_IO_FLUSH: {
        /* fdatasync: the data of every completed write and the metadata to find it. */
        int ferr = __atomic_load_n(&ub->flush_err, __ATOMIC_RELAXED);
        if (vhd_unlikely(ferr)) {
            finish(io, ferr);
            return;
        }
        sqe = get_sqe(io);
        if (vhd_unlikely(!sqe)) {
            finish(io, -EBUSY);
            return;
        }
        io_uring_prep_fsync(sqe, ub->fd, IORING_FSYNC_DATASYNC);
        queue_sqe(io, sqe);
        return;
    }
    case VHD_BLK_IO_DISCARD:
        if (io->len == 0) {
            finish(io, 0);
            return;
        }
        if (flag_get(&ub->no_punch)) {
            discard_fallback(ub, io);
            return;
        }
        issue_fallocate(ub, io, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE);
        return;
    case VHD_BLK_IO_WRITE_ZEROES:
        if (io->len == 0) {
            finish(io, 0);
            return;
        }
        wz_issue(ub, io);
        return;
    default:
        finish(io, -EOPNOTSUPP);
        return;
    }
}

/*
 * resize: a regular file grows sparse (ftruncate) or is cut; cutting over
 * allocated data (SEEK_DATA finds some past the new end) needs force. A
 * block device's size is its own: -ENOTSUP.
 */
static int uring_resize_check(struct vhd_blk_backend *be, uint64_t size, bool force, char *err,
                              size_t errlen)
{
    struct uring_be *ub = to_ub(be);

    if (ub->blkdev)
        return vhd_errf(err, errlen, -ENOTSUP, "%s is a block device: resize it, not the disk",
                        be->desc);
    if (be->ro)
        return vhd_errf(err, errlen, -EROFS, "the image is read-only");
    if (size < be->size && !force) {
        off_t data = lseek(ub->fd, (off_t)size, SEEK_DATA);
        if (data >= 0 && (uint64_t)data < be->size)
            return vhd_errf(err, errlen, -EBUSY,
                            "the image holds data past %llu bytes (at %lld): shrinking would lose "
                            "it (force to do it anyway)",
                            (unsigned long long)size, (long long)data);
    }
    return 0;
}

static int uring_resize(struct vhd_blk_backend *be, uint64_t size, bool force, char *err,
                        size_t errlen)
{
    struct uring_be *ub = to_ub(be);
    int rc = uring_resize_check(be, size, force, err, errlen);

    if (rc < 0)
        return rc;
    if (ftruncate(ub->fd, (off_t)size) < 0)
        return vhd_errf(err, errlen, -errno, "cannot resize the image to %llu bytes: %s",
                        (unsigned long long)size, strerror(errno));
    be->size = size;
    return 0;
}

const struct vhd_blk_backend_ops vhd_blk_backend_uring = {
    .resize = uring_resize,
    .resize_check = uring_resize_check,
    .name = "uring",
    .open = uring_open,
    .close = uring_close,
    .submit = uring_submit,
    .uring_ops = 1ull << IORING_OP_READV | 1ull << IORING_OP_WRITEV | 1ull << IORING_OP_FALLOCATE |
                 1ull << IORING_OP_FSYNC,
};
