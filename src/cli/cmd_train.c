/* `pipetrain train`: the training driver (src/train/train.h), entered after main.c's
 * MPI_Init on every rank. */
#include "src/cli/commands.h"
#include "src/train/train.h"

int cmd_train(int argc, char **argv)
{
    return train_main(argc, argv);
}
