/* Helpers shared by the Criterion suites: tolerance comparison that reports the worst
 * element, and paths to the source and build trees (set by ctest). */
#ifndef PT_TESTS_CHECK_H
#define PT_TESTS_CHECK_H

#include <criterion/criterion.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>

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

#endif
