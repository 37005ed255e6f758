# SPDX-License-Identifier: BSD-3-Clause
# IOPS by iodepth, null backend 4K randread, vhostd vs qemu-storage-daemon, 1 and 2
# queues; one panel per configuration that was run (event, adaptive, adaptive-benchpoll).
# Input: datadir/plot-CONFIG.dat from bench/summarize.py. Output: datadir/iops-by-iodepth.png
# usage: gnuplot -e "datadir='build/bench'" bench/iops-by-iodepth.gp
if (!exists("datadir")) datadir = "build/bench"

configs = "event adaptive adaptive-benchpoll shared-event"
titles = "'event: no polling, bench interrupt' 'adaptive: daemons adaptive-poll, bench interrupt' 'adaptive-benchpoll: daemons adaptive-poll, bench polls' 'shared-event: no polling, bench on the daemon CPU'"
present = ""
do for [i = 1:words(configs)] {
    c = word(configs, i)
    if (system("test -s " . datadir . "/plot-" . c . ".dat && echo 1 || echo 0") + 0 == 1) {
        present = present . " " . i
    }
}
n = words(present)
if (n == 0) { print "iops-by-iodepth.gp: no plot-*.dat in " . datadir; exit }

cols = n < 2 ? n : 2
rows = (n + 1) / 2
set terminal pngcairo size (600 * cols), (430 * rows + 40) font "DejaVu Sans,10"
set output datadir . "/iops-by-iodepth.png"
set multiplot layout rows, cols title "4 KiB randread, null backend: IOPS by iodepth (median of A/B rounds; daemon pinned to one CPU, bench to the other unless shared)"
set logscale x 2
set xtics ("1" 1, "32" 32, "128" 128)
set xrange [0.7:180]
# log y: the range spans three decades (iodepth 1 in event mode to 128 shared),
# and equal ratios show as equal distances
set logscale y 10
set yrange [*:*]
set format y "%g"
set xlabel "iodepth (per queue)"
set ylabel "kIOPS (log scale)"
set grid
set key bottom right box opaque
set datafile missing "NaN"
set style line 1 lc rgb "#1f77b4" lw 2 pt 7 ps 1.2
set style line 2 lc rgb "#d62728" lw 2 pt 5 ps 1.2
set style line 3 lc rgb "#1f77b4" lw 2 dt 2 pt 6 ps 1.2
set style line 4 lc rgb "#d62728" lw 2 dt 2 pt 4 ps 1.2
do for [k = 1:n] {
    i = word(present, k) + 0
    f = datadir . "/plot-" . word(configs, i) . ".dat"
    set title word(titles, i)
    plot f using 1:($2 / 1000) with linespoints ls 1 title "vhostd, 1 queue", \
         f using 1:($3 / 1000) with linespoints ls 2 title "qsd, 1 queue", \
         f using 1:($4 / 1000) with linespoints ls 3 title "vhostd, 2 queues", \
         f using 1:($5 / 1000) with linespoints ls 4 title "qsd, 2 queues"
}
unset multiplot
