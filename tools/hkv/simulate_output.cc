#include "simulate_output.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <system_error>

#include <fmt/format.h>

namespace hkv::cli {
namespace {

Status WriteOne(const std::filesystem::path& file, const std::vector<ReplayStep>& log) {
  std::ofstream out(file);
  if (!out) return Status::InvalidArgument(fmt::format("cannot write {}", file.string()));
  out << "step,running,waiting,blocks_used,cached_blocks,hit_tokens,preemptions,"
         "scheduled_tokens\n";
  for (const ReplayStep& s : log) {
    out << fmt::format("{},{},{},{},{},{},{},{}\n", s.step, s.running, s.waiting, s.blocks_used,
                       s.cached_blocks, s.hit_tokens, s.preemptions, s.scheduled_tokens);
  }
  out.flush();
  if (!out) return Status::InvalidArgument(fmt::format("writing {} failed", file.string()));
  return Status::Ok();
}

// gnuplot's string syntax: single quotes, a quote doubled.
std::string Quoted(const std::string& text) {
  std::string q = "'";
  for (char c : text) {
    q += c;
    if (c == '\'') q += '\'';
  }
  return q + "'";
}

}  // namespace

Status WriteStepCsv(const std::filesystem::path& dir, const std::vector<StepSeries>& series) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return Status::InvalidArgument(
        fmt::format("cannot create directory {}: {}", dir.string(), ec.message()));
  }
  for (const StepSeries& s : series)
    HKV_RETURN_IF_ERROR(WriteOne(dir / (s.allocator + ".csv"), *s.log));
  return Status::Ok();
}

Status WritePlot(const std::filesystem::path& png, const std::string& title,
                 const std::vector<StepSeries>& series) {
  // gnuplot reads the data by file name: one file per run in a private temporary directory, with
  // preemptions and hits already summed.
  std::string tmpl = (std::filesystem::temp_directory_path() / "hkv-plot-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    return Status::InvalidArgument("cannot create a temporary directory for the plot data");
  }
  const std::filesystem::path dir = tmpl;
  Status status = Status::Ok();
  std::vector<std::string> files;
  for (const StepSeries& s : series) {
    files.push_back((dir / (s.allocator + ".dat")).string());
    std::ofstream out(files.back());
    int64_t preemptions = 0, hits = 0;
    for (const ReplayStep& st : *s.log) {
      preemptions += st.preemptions;
      hits += st.hit_tokens;
      out << fmt::format("{} {} {} {} {}\n", st.step, st.running, st.waiting, preemptions, hits);
    }
    out.flush();
    if (!out) status = Status::InvalidArgument(fmt::format("cannot write {}", files.back()));
  }
  if (status.ok()) {
    std::string script = fmt::format(
        "set terminal png size 1400,900\nset output {}\nset key top left\nset grid\n"
        "set multiplot layout 2,2 title {}\n",
        Quoted(png.string()), Quoted(title));
    const char* panels[] = {"running requests", "waiting requests", "preemptions (cumulative)",
                            "prefix-hit tokens (cumulative)"};
    for (int p = 0; p < 4; ++p) {
      script += fmt::format("set title {}\nset xlabel 'step'\nplot ", Quoted(panels[p]));
      for (size_t i = 0; i < series.size(); ++i) {
        script += fmt::format("{}{} using 1:{} with lines lw 2 title {}", i == 0 ? "" : ", ",
                              Quoted(files[i]), p + 2, Quoted(series[i].allocator));
      }
      script += "\n";
    }
    script += "unset multiplot\n";
    FILE* pipe = popen("gnuplot 2>&1", "w");
    if (pipe == nullptr) {
      status = Status::InvalidArgument("cannot start gnuplot (install gnuplot-nox)");
    } else {
      fputs(script.c_str(), pipe);
      const int rc = pclose(pipe);
      if (rc != 0) {
        status = Status::InvalidArgument(fmt::format(
            "gnuplot failed (status {}) writing {}; is gnuplot-nox installed?", rc, png.string()));
      }
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return status;
}

}  // namespace hkv::cli
