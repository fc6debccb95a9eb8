// Constructors of the shipped policies (their classes live in their own files); MakePolicy
// validates the options before calling them.
#pragma once

#include <memory>

#include <hkv/policy/policies.h>

namespace hkv::policy_internal {

std::unique_ptr<KvPolicy> NewDense();
std::unique_ptr<KvPolicy> NewStreamingLlm(int32_t sinks);
std::unique_ptr<KvPolicy> NewH2O(int32_t recent, bool normalize_by_age);
std::unique_ptr<KvPolicy> NewTova();
std::unique_ptr<KvPolicy> NewSnapKv(int32_t window, int32_t kernel, bool max_pool);
std::unique_ptr<KvPolicy> NewKnorm(int32_t recent);

}  // namespace hkv::policy_internal
