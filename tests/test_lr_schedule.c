/* The learning-rate schedule (src/train/lr_schedule.h): values against Python's evaluation
 * of the documented formula in double, rounded to float32 (struct.pack('f', ...)), which is
 * what the PyTorch parity runs compute; warm-up, the floor, the clamp past the last step
 * and the degenerate spans. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "src/train/lr_schedule.h"

static void expect_steps(const lr_schedule *s, long total, const float *want, int n)
{
    for (int i = 0; i < n; i++) {
        float got = lr_schedule_at(s, i, total);
        cr_expect(got == want[i], "%s warmup %ld total %ld step %d: %a, expected %a",
                  lr_schedule_name(s->kind), s->warmup, total, i, (double)got,
                  (double)want[i]);
    }
}

/* for s in range(total + 2): float32 of the formula (Python 3, math.cos) */
Test(lr_schedule, linear_with_warmup_matches_python)
{
    lr_schedule s = {.kind = LR_LINEAR, .lr = 0.001, .lr_min = 0, .warmup = 2};
    const float want[] = {0x1.0624dep-11f, 0x1.0624dep-10f, 0x1.0624dep-10f, 0x1.a36e2ep-11f,
                          0x1.3a92a4p-11f, 0x1.a36e2ep-12f, 0x1.a36e2ep-13f, 0, 0};
    expect_steps(&s, 7, want, 9);
}

Test(lr_schedule, cosine_with_warmup_matches_python)
{
    lr_schedule s = {.kind = LR_COSINE, .lr = 0.001, .lr_min = 0, .warmup = 2};
    const float want[] = {0x1.0624dep-11f, 0x1.0624dep-10f, 0x1.0624dep-10f, 0x1.da3914p-11f,
                          0x1.5726a4p-11f, 0x1.6a462cp-12f, 0x1.908538p-14f, 0, 0};
    expect_steps(&s, 7, want, 9);
}

/* nanoGPT's shape: 10 warm-up steps to 6e-4, cosine down to 6e-5 over 100 steps */
Test(lr_schedule, cosine_to_a_floor_matches_python)
{
    lr_schedule s = {.kind = LR_COSINE, .lr = 6e-4, .lr_min = 6e-5, .warmup = 10};
    const struct { long step; float lr; } want[] = {
        {0, 0x1.f75104p-15f},  {9, 0x1.3a92a4p-11f},  {10, 0x1.3a92a4p-11f},
        {11, 0x1.3a7c90p-11f}, {50, 0x1.8b314cp-12f}, {98, 0x1.fcd56ep-15f},
        {99, 0x1.f8b23ap-15f}, {100, 0x1.f75104p-15f}, {1000, 0x1.f75104p-15f},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        float got = lr_schedule_at(&s, want[i].step, 100);
        cr_expect(got == want[i].lr, "step %ld: %a, expected %a", want[i].step, (double)got,
                  (double)want[i].lr);
    }
    /* the floor is reached at the end and never passed */
    cr_expect(lr_schedule_at(&s, 100, 100) == (float)6e-5);
    for (long t = 10; t < 200; t++) {
        float a = lr_schedule_at(&s, t, 100), b = lr_schedule_at(&s, t + 1, 100);
        cr_expect(b <= a && b >= (float)6e-5, "step %ld: %a then %a", t, (double)a, (double)b);
    }
}

Test(lr_schedule, constant_is_the_lr_after_warmup)
{
    lr_schedule s = {.kind = LR_CONSTANT, .lr = 0.05, .warmup = 3};
    const float want[] = {0x1.111112p-6f, 0x1.111112p-5f, 0x1.99999ap-5f, 0x1.99999ap-5f,
                          0x1.99999ap-5f, 0x1.99999ap-5f, 0x1.99999ap-5f};
    expect_steps(&s, 5, want, 7);
    /* no warm-up: the float the user wrote, at every step, whatever the total */
    s.warmup = 0;
    for (long t = 0; t < 50; t++) cr_expect(lr_schedule_at(&s, t, 10) == 0.05f);
}

/* a run no longer than its warm-up, and a run of one step: no division by zero, no NaN */
Test(lr_schedule, short_runs)
{
    lr_schedule s = {.kind = LR_COSINE, .lr = 0.01, .lr_min = 0.001, .warmup = 4};
    for (long t = 0; t < 4; t++)
        cr_expect(lr_schedule_at(&s, t, 4) == (float)(0.01 * (double)(t + 1) / 4.0));
    /* after a warm-up as long as the run, p = (s − W)/1: the peak, then the floor */
    cr_expect(lr_schedule_at(&s, 4, 4) == 0.01f, "the first step after the warm-up: the peak");
    cr_expect(lr_schedule_at(&s, 5, 4) == (float)0.001, "past the end: the floor");
    s.warmup = 0;
    cr_expect(lr_schedule_at(&s, 0, 1) == 0.01f, "the only step of a run: the peak");
    s.kind = LR_LINEAR;
    cr_expect(lr_schedule_at(&s, 0, 1) == 0.01f);
    cr_expect(lr_schedule_at(&s, 1, 1) == (float)0.001);
}

Test(lr_schedule, names)
{
    cr_expect_str_eq(lr_schedule_name(LR_CONSTANT), "constant");
    cr_expect_str_eq(lr_schedule_name(LR_COSINE), "cosine");
    cr_expect_str_eq(lr_schedule_name(LR_LINEAR), "linear");
    cr_expect_str_eq(lr_schedule_name((lr_schedule_kind)7), "?");
}
