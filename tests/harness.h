/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Minimal unit-test harness: VHD_TEST(name) registers a test; each test runs
 * in a forked child with a timeout, so a crash or hang fails that test only.
 * The program's last line is "<prog>: N passed, N failed[, N skipped]"; it
 * exits non-zero when any test failed. Arguments select tests by substring.
 */
#ifndef VHD_TEST_HARNESS_H
#define VHD_TEST_HARNESS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*vhd_test_fn)(void);
void vhd_test_register(const char *name, vhd_test_fn fn);
/* Mark the running test skipped (with a reason) and end it. */
void vhd_test_skip(const char *why) __attribute__((noreturn));

#define VHD_TEST(name)                                                 \
    static void name(void);                                            \
    __attribute__((constructor)) static void vhd_test_reg_##name(void) \
    {                                                                  \
        vhd_test_register(#name, name);                                \
    }                                                                  \
    static void name(void)

/* Fail the current test (the child exits) with the location and message. */
#define VHD_CHECK(cond)                                                                \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "  %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

#define VHD_CHECK_EQ(a, b)                                                                \
    do {                                                                                  \
        long long vhd_a_ = (long long)(a), vhd_b_ = (long long)(b);                       \
        if (vhd_a_ != vhd_b_) {                                                           \
            fprintf(stderr, "  %s:%d: check failed: %s == %s (%lld != %lld)\n", __FILE__, \
                    __LINE__, #a, #b, vhd_a_, vhd_b_);                                    \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

#endif /* VHD_TEST_HARNESS_H */
