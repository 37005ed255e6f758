/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Race points: named places between the check of a field that the other side
 * can write (the inflight area, guest memory, the dirty log) and its use, for
 * tests that rewrite the field exactly there. The shipped library has none:
 * VHD_RACE_POINT expands to nothing unless VHD_TEST_RACE_HOOKS is defined,
 * which only a test program sets when it compiles its own copy of a source.
 */
#ifndef VHD_RACE_H
#define VHD_RACE_H

#ifdef VHD_TEST_RACE_HOOKS
/*
 * Defined by the test program (never by the library): called at each race
 * point with its name, from the thread that runs the code. NULL: no hook.
 * The call is opaque to the compiler, so any field the code reads from
 * shared memory after it is read again: exactly the double fetch a test
 * wants to expose.
 */
extern void (*vhd_race_hook)(const char *point);
#define VHD_RACE_POINT(point)     \
    do {                          \
        if (vhd_race_hook)        \
            vhd_race_hook(point); \
    } while (0)
#else
#define VHD_RACE_POINT(point) ((void)0)
#endif

#endif /* VHD_RACE_H */
