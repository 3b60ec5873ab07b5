/* mtcfs: the per-node daemon. See fs/fs.h. */
#include "fs/fs.h"

int main(int argc, char **argv)
{
	return fs_main(argc, argv);
}
