// `hkv trace gen` in process: deterministic JSONL out, bad options rejected by name.
#include "trace_command.h"

#include <sstream>

#include <gtest/gtest.h>

#include <hkv/sim/trace.h>

namespace hkv::cli {
namespace {

TEST(TraceCommandTest, WritesADeterministicReadableTrace) {
  TraceGenArgs args;
  args.options.num_requests = 40;
  args.options.seed = 11;
  std::ostringstream out1, out2, err;
  ASSERT_EQ(RunTraceGen(args, out1, err), 0) << err.str();
  ASSERT_EQ(RunTraceGen(args, out2, err), 0);
  EXPECT_EQ(out1.str(), out2.str());
  EXPECT_NE(err.str().find("40 requests"), std::string::npos) << err.str();
  const Result<Trace> t = ParseTrace(out1.str(), "stdout");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->size(), 40u);
}

TEST(TraceCommandTest, BadOptionsExitOne) {
  TraceGenArgs args;
  args.options.max_turns = 0;
  std::ostringstream out, err;
  EXPECT_EQ(RunTraceGen(args, out, err), 1);
  EXPECT_TRUE(out.str().empty());
  EXPECT_NE(err.str().find("max_turns = 0"), std::string::npos) << err.str();
  args.options.max_turns = 2;
  args.output = "/nonexistent/dir/trace.jsonl";
  EXPECT_EQ(RunTraceGen(args, out, err), 1);
  EXPECT_NE(err.str().find("/nonexistent/dir/trace.jsonl"), std::string::npos) << err.str();
}

}  // namespace
}  // namespace hkv::cli
