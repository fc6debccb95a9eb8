// The trace format of replay.md: canonical writing, reading back, and rejecting bad lines.
#include <filesystem>
#include <sstream>

#include <gtest/gtest.h>

#include <hkv/sim/trace.h>

namespace hkv {
namespace {

Trace Sample() {
  TraceRequest a;
  a.id = 0;
  a.arrival_step = 3;
  a.prompt = {1, 2, 3};
  a.output_len = 2;
  a.output = {7, 8};
  a.session = 0;
  a.turn = 0;
  a.system_prompt = 1;
  TraceRequest b = a;
  b.id = 1;
  b.arrival_step = 9;
  b.prompt = {1, 2, 3, 7, 8, 4};
  b.output_len = 1;
  b.output = {5};
  b.turn = 1;
  b.parent = 0;
  TraceRequest c;
  c.id = 2;
  c.arrival_step = 9;
  c.prompt = {42};
  c.output_len = 4;  // outputs left to the replayer
  return {a, b, c};
}

std::string Write(const Trace& t) {
  std::ostringstream out;
  WriteTrace(t, out);
  return out.str();
}

TEST(TraceTest, WritesCanonicalLinesThatReadBackEqual) {
  const std::string text = Write(Sample());
  EXPECT_EQ(text.substr(0, text.find('\n')),
            R"({"id":0,"arrival_step":3,"prompt":[1,2,3],"output_len":2,"output":[7,8],)"
            R"("session":0,"turn":0,"parent":null,"system_prompt":1})");
  const Result<Trace> back = ParseTrace(text, "t.jsonl");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, Sample());
  EXPECT_EQ(Write(*back), text);
}

TEST(TraceTest, FileRoundTripAndMissingFile) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() / "hkv_trace.jsonl";
  ASSERT_TRUE(WriteTraceFile(Sample(), path).ok());
  const Result<Trace> back = ReadTrace(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, Sample());
  std::filesystem::remove(path);
  EXPECT_EQ(ReadTrace(path).status().code(), StatusCode::kNotFound);
}

TEST(TraceTest, OptionalFieldsMayBeAbsentAndBlankLinesAreSkipped) {
  const Result<Trace> t =
      ParseTrace("{\"id\":5,\"arrival_step\":0,\"prompt\":[9],\"output_len\":1}\n\n", "t");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->size(), 1u);
  EXPECT_EQ((*t)[0].parent, -1);
  EXPECT_EQ((*t)[0].session, -1);
  EXPECT_TRUE((*t)[0].output.empty());
}

void ExpectRejected(const std::string& jsonl, std::string_view fragment) {
  const Result<Trace> t = ParseTrace(jsonl, "bad.jsonl");
  ASSERT_FALSE(t.ok()) << jsonl;
  EXPECT_NE(t.status().message().find(fragment), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("bad.jsonl:"), std::string::npos);
}

TEST(TraceTest, RejectsBadLinesNamingLineAndField) {
  const std::string ok = R"({"id":0,"arrival_step":0,"prompt":[1],"output_len":1})";
  ExpectRejected(ok + "\n{\"id\":", "bad.jsonl:2: invalid JSON");
  ExpectRejected("[1]", "expected a JSON object");
  ExpectRejected(R"({"arrival_step":0,"prompt":[1],"output_len":1})", "'id' missing");
  ExpectRejected(R"({"id":0,"arrival_step":-1,"prompt":[1],"output_len":1})",
                 "'arrival_step' = -1");
  ExpectRejected(R"({"id":0,"arrival_step":0,"prompt":[],"output_len":1})", "at least one token");
  ExpectRejected(R"({"id":0,"arrival_step":0,"prompt":[1,-2],"output_len":1})", "item 1");
  ExpectRejected(R"({"id":0,"arrival_step":0,"prompt":[1],"output_len":0})", "'output_len' = 0");
  ExpectRejected(R"({"id":0,"arrival_step":0,"prompt":[1],"output_len":2,"output":[3]})",
                 "output_len = 2 tokens (found 1)");
  ExpectRejected(R"({"id":0,"arrival_step":5,"prompt":[1],"output_len":1})"
                 "\n"
                 R"({"id":1,"arrival_step":4,"prompt":[1],"output_len":1})",
                 "bad.jsonl:2: arrival_step = 4 is before");
  ExpectRejected(ok + "\n" + ok, "id = 0 appears twice");
  ExpectRejected(R"({"id":0,"arrival_step":0,"prompt":[1],"output_len":1,"parent":3})",
                 "parent = 3");
}

}  // namespace
}  // namespace hkv
