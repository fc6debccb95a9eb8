// Outputs of `hkv simulate` beyond the table: per-step CSV files and a PNG plot.
//
// Contract: WriteStepCsv writes DIR/<allocator>.csv (DIR created if missing) with one row per
// replayed step: step, running, waiting, blocks_used, cached_blocks, hit_tokens, preemptions,
// scheduled_tokens. WritePlot draws running, waiting, cumulative preemptions and cumulative
// prefix-hit tokens of every run over time into a PNG by piping a script to gnuplot; a missing
// gnuplot or a failed plot is an error naming the cause.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <hkv/common/status.h>
#include <hkv/sim/replayer.h>

namespace hkv::cli {

struct StepSeries {
  std::string allocator;
  const std::vector<ReplayStep>* log = nullptr;
};

Status WriteStepCsv(const std::filesystem::path& dir, const std::vector<StepSeries>& series);
Status WritePlot(const std::filesystem::path& png, const std::string& title,
                 const std::vector<StepSeries>& series);

}  // namespace hkv::cli
