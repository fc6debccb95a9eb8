#include <string>

#include <fmt/format.h>

#include <hkv/policy/policies.h>

#include "policy_factories.h"

namespace hkv {

std::string_view PolicyKindName(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kDense:
      return "dense";
    case PolicyKind::kStreamingLlm:
      return "streaming_llm";
    case PolicyKind::kH2O:
      return "h2o";
    case PolicyKind::kTova:
      return "tova";
    case PolicyKind::kSnapKv:
      return "snapkv";
    case PolicyKind::kKnorm:
      return "knorm";
  }
  return "dense";
}

Result<PolicyKind> ParsePolicyKind(std::string_view name) {
  for (PolicyKind k : kAllPolicyKinds) {
    if (name == PolicyKindName(k)) return k;
  }
  return Status::InvalidArgument(
      fmt::format("policy '{}': expected dense, streaming_llm, h2o, tova, snapkv or knorm", name));
}

Result<std::unique_ptr<KvPolicy>> MakePolicy(const PolicyConfig& c) {
  using namespace policy_internal;
  switch (c.kind) {
    case PolicyKind::kDense:
      return NewDense();
    case PolicyKind::kStreamingLlm:
      if (c.sinks < 0) {
        return Status::InvalidArgument(
            fmt::format("streaming_llm: sinks = {}: expected >= 0", c.sinks));
      }
      return NewStreamingLlm(c.sinks);
    case PolicyKind::kH2O:
      if (c.recent < 0) {
        return Status::InvalidArgument(fmt::format("h2o: recent = {}: expected >= 0", c.recent));
      }
      return NewH2O(c.recent, c.normalize_by_age);
    case PolicyKind::kTova:
      return NewTova();
    case PolicyKind::kSnapKv:
      if (c.window < 1) {
        return Status::InvalidArgument(fmt::format("snapkv: window = {}: expected >= 1", c.window));
      }
      if (c.kernel < 1 || c.kernel % 2 == 0) {
        return Status::InvalidArgument(
            fmt::format("snapkv: kernel = {}: expected an odd width >= 1", c.kernel));
      }
      return NewSnapKv(c.window, c.kernel, c.max_pool);
    case PolicyKind::kKnorm:
      if (c.recent < 0) {
        return Status::InvalidArgument(fmt::format("knorm: recent = {}: expected >= 0", c.recent));
      }
      return NewKnorm(c.recent);
  }
  return Status::InvalidArgument("policy: unknown kind");
}

}  // namespace hkv
