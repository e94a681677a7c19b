# usage: bash exp_ncu.sh CASE...  (each CASE as exp_ncu.py takes it); reports under $OUT
NCU=/usr/local/cuda/bin/ncu
for c in "$@"; do
  tag=$(echo $c | tr ':' '_')
  timeout 200 $NCU --target-processes all -k regex:decode_wgmma --launch-skip 2 --launch-count 1 --set full -o $OUT/ncu_$tag python exp_ncu.py $c > $OUT/ncu_$tag.log 2>&1
  $NCU --import $OUT/ncu_$tag.ncu-rep --page raw > $OUT/raw_$tag.txt 2>&1
  echo "== $c"; grep -E "gpu__time_duration.sum |l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum |l1tex__data_pipe_lsu_wavefronts_mem_shared.sum |l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum |l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum |l1tex__t_sector_hit_rate.pct |l1tex__throughput.avg.pct_of_peak_sustained_active |lts__t_sectors_srcunit_tex_op_read.sum |smsp__inst_executed.sum |l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum |l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum " $OUT/raw_$tag.txt
  grep -E "smsp__pcsamp_warps_issue_stalled_[a-z_]+ " $OUT/raw_$tag.txt | grep -v not_issued | awk '{print $1, $NF}' | sed 's/smsp__pcsamp_warps_issue_stalled_//' | sort -k2 -g -r | head -8 | tr '\n' ';'; echo
done
