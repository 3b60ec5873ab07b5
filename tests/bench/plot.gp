# tests/bench/plot.gp: the shard-size sweep of tests/bench/run as one PNG.
#
#   gnuplot -e "datafile='tests/bench/out/scaling.dat'; outfile='tests/bench/out/scaling.png'" \
#           tests/bench/plot.gp
#
# (run does this at the end of a run with the sweep section; gnuplot-nox from
# Debian has the pngcairo terminal used here.)
#
# scaling.dat columns (medians; NaN = not measured):
#   1 size_mib  2 fs_write_tmpfs  3 fs_write_mtcfs  4 fs_read_tmpfs  5 fs_read_mtcfs
#   6 red_tcp_gibs  7 red_mtcfs_gibs  8 rst_tcp_gibs  9 rst_mtcfs_gibs      (GiB/s)
#   10 red_tcp_s  11 red_mtcfs_s  12 rst_tcp_s  13 rst_mtcfs_s             (seconds)
# Three panels: throughput, time to ready, mtcfs/baseline ratio; mtcfs solid,
# its baseline dashed in the same colour.

if (!exists("datafile")) datafile = "tests/bench/out/scaling.dat"
if (!exists("outfile")) outfile = "tests/bench/out/scaling.png"
if (!exists("plottitle")) plottitle = "mtcfs vs baselines by shard size"

set terminal pngcairo size 1800,760 font "DejaVu Sans,11" noenhanced
set output outfile
set datafile missing "NaN"
set datafile commentschars "#"

set logscale x 2
set xrange [48:5600]
set xtics ("64 MiB" 64, "256 MiB" 256, "1 GiB" 1024, "4 GiB" 4096)
unset xlabel                  # the x axis is the shard size: 4 equal files
set bmargin 9                 # the same plot height in every panel, keys below
set grid xtics ytics lc rgb "#dddddd"
set key below left box font ",10" spacing 1.1 maxrows 4

c_w = "#1f77b4"    # fs write
c_r = "#2ca02c"    # fs first read
c_p = "#d62728"    # time to redundancy (replication)
c_s = "#9467bd"    # restore from the peer

set multiplot layout 1,3 title plottitle." — x: shard size (4 equal files)" font ",13"

# 1: throughput
set title "throughput (GiB/s, median)"
set ylabel "GiB/s"
set yrange [0:*]
plot datafile u 1:3 w lp lw 2 pt 7 lc rgb c_w t "fs write: mtcfs", \
     ''       u 1:2 w lp lw 2 pt 6 dt 2 lc rgb c_w t "fs write: tmpfs", \
     ''       u 1:5 w lp lw 2 pt 7 lc rgb c_r t "fs first read: mtcfs", \
     ''       u 1:4 w lp lw 2 pt 6 dt 2 lc rgb c_r t "fs first read: tmpfs", \
     ''       u 1:7 w lp lw 2 pt 5 lc rgb c_p t "rename → replica: mtcfs", \
     ''       u 1:6 w lp lw 2 pt 4 dt 2 lc rgb c_p t "replica: raw TCP", \
     ''       u 1:9 w lp lw 2 pt 9 lc rgb c_s t "restore from peer: mtcfs", \
     ''       u 1:8 w lp lw 2 pt 8 dt 2 lc rgb c_s t "restore: raw TCP"

# 2: time to ready
set title "time to ready (s, median; log scale)"
set ylabel "seconds"
set logscale y 10
set yrange [*:*]
set format y "%g"
plot datafile u 1:11 w lp lw 2 pt 5 lc rgb c_p t "rename → verified replica on the peer: mtcfs", \
     ''       u 1:10 w lp lw 2 pt 4 dt 2 lc rgb c_p t "same bytes over raw TCP", \
     ''       u 1:13 w lp lw 2 pt 9 lc rgb c_s t "yaml → markers, restored from the peer: mtcfs", \
     ''       u 1:12 w lp lw 2 pt 8 dt 2 lc rgb c_s t "same bytes over raw TCP"
unset logscale y

# 3: ratio
set title "mtcfs / baseline (speed ratio, median)"
set ylabel "ratio"
set yrange [0:1.3<*<3]
set arrow 1 from 48,0.65 to 5600,0.65 nohead dt 3 lc rgb "#555555"
set arrow 2 from 48,0.75 to 5600,0.75 nohead dt 3 lc rgb "#555555"
set label 1 "fs goal 0.65" at 2200,0.62 font ",9" tc rgb "#555555"
set label 2 "peer goal 0.75" at 2000,0.78 font ",9" tc rgb "#555555"
plot datafile u 1:($3/$2) w lp lw 2 pt 7 lc rgb c_w t "fs write", \
     ''       u 1:($5/$4) w lp lw 2 pt 7 lc rgb c_r t "fs first read", \
     ''       u 1:($7/$6) w lp lw 2 pt 5 lc rgb c_p t "time to redundancy", \
     ''       u 1:($9/$8) w lp lw 2 pt 9 lc rgb c_s t "restore from the peer"

unset multiplot
