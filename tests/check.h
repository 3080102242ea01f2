/* Helpers shared by the Criterion suites: tolerance comparison that reports the worst
 * element, bit-for-bit comparison, paths to the source and build trees (set by ctest) and
 * the repository's model files. */
#ifndef PT_TESTS_CHECK_H
#define PT_TESTS_CHECK_H

#include <criterion/criterion.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "src/model/net.h"

/* Asserts |a−ref| ≤ atol + rtol·|ref| element-wise; on failure names the worst element. */
#define CHECK_CLOSE(what, a, ref, count, atol, rtol)                                          \
    do {                                                                                      \
        size_t worst_ = 0;                                                                    \
        double excess_ = -INFINITY;                                                           \
        for (size_t i_ = 0; i_ < (size_t)(count); i_++) {                                     \
            double d_ = fabs((double)(a)[i_] - (double)(ref)[i_]);                            \
            double lim_ = (atol) + (rtol) * fabs((double)(ref)[i_]);                          \
            double e_ = (d_ != d_) ? INFINITY : d_ - lim_;                                    \
            if (e_ > excess_) { excess_ = e_; worst_ = i_; }                                  \
        }                                                                                     \
        cr_assert(excess_ <= 0, "%s: element %zu is %.9g, reference %.9g (atol %g, rtol %g)", \
                  (what), worst_, (double)(a)[worst_], (double)(ref)[worst_],                 \
                  (double)(atol), (double)(rtol));                                           \
    } while (0)

static inline const char *check_source_dir(void)
{
    const char *d = getenv("PT_SOURCE_DIR");
    return d ? d : ".";
}

/* models/NAME of the source tree into net (the test fails with the parser's message). */
static inline void load_model(net_desc *net, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/models/%s", check_source_dir(), name);
    cr_assert_eq(net_desc_load(net, path), 0, "%s: %s", path, pt_error_get());
}

/* How many of n floats differ in their bits. */
static inline size_t count_differences(const float *a, const float *b, size_t n)
{
    size_t diff = 0;
    for (size_t i = 0; i < n; i++) diff += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return diff;
}

#endif
