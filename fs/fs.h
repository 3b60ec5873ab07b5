/* fs: the FUSE front of mtcfs. fs_main() parses the command line
 * (mtcfs [-f] [-d] [-o OPT,...] RAMDIR MOUNTPOINT), opens the RAM tier, mounts,
 * and serves until unmounted. Owns the FUSE session, the inode table, commit
 * detection and the control thread. */
#ifndef MTCFS_FS_FS_H
#define MTCFS_FS_FS_H

int fs_main(int argc, char **argv);

#endif
