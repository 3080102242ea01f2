/* What a checkpoint's file name is (ckpt_dir_name_step): one definition that train and
 * `pipetrain launch` share (issue 23 item 7: a stray ckpt-best.safetensors made launch
 * resume from a directory train found no checkpoint in). */
#include <criterion/criterion.h>

#include "src/io/checkpoint_dir.h"

Test(checkpoint_name, steps_of_checkpoints)
{
    cr_expect_eq(ckpt_dir_name_step("ckpt-0000000120.safetensors"), 120);
    cr_expect_eq(ckpt_dir_name_step("ckpt-0000000000.safetensors"), 0);
    cr_expect_eq(ckpt_dir_name_step("ckpt-7.safetensors"), 7);
    char name[64];
    ckpt_dir_file("", 4321, name, sizeof name); /* "/ckpt-...": what train writes */
    cr_expect_eq(ckpt_dir_name_step(name + 1), 4321, "%s", name);
}

Test(checkpoint_name, other_names_are_not_checkpoints)
{
    const char *not[] = {"ckpt-best.safetensors", "ckpt-.safetensors", "ckpt- 12.safetensors",
                         "ckpt-+12.safetensors", "ckpt--1.safetensors", "ckpt-12.safetensors.tmp-1-abc",
                         "ckpt-12.safetensor", "ckpt-12x.safetensors", "xckpt-12.safetensors",
                         ".pipetrain-launch-status", "ckpt-1234567890123456789012.safetensors"};
    for (size_t i = 0; i < sizeof not / sizeof *not; i++)
        cr_expect_eq(ckpt_dir_name_step(not[i]), -1, "%s", not[i]);
}
