// PolicyBudget: how many tokens a policy keeps, as a count or a share of the sequence, and its
// text form for command lines and configs.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>
#include <system_error>

#include <fmt/format.h>

#include <hkv/policy/policies.h>

namespace hkv {

Result<PolicyBudget> PolicyBudget::Tokens(int64_t tokens) {
  if (tokens < 1) {
    return Status::InvalidArgument(fmt::format("budget of {} tokens: expected >= 1", tokens));
  }
  PolicyBudget b;
  b.tokens_ = tokens;
  return b;
}

Result<PolicyBudget> PolicyBudget::Fraction(double share) {
  if (!(share > 0.0 && share <= 1.0)) {
    return Status::InvalidArgument(
        fmt::format("budget fraction {}: expected a share in (0, 1]", share));
  }
  PolicyBudget b;
  b.share_ = share;
  return b;
}

int64_t PolicyBudget::Resolve(int64_t length) const {
  if (tokens_ > 0) return tokens_;
  // Rounded up, but a product that is an integer up to floating-point error (0.07 * 100 =
  // 7.000000000000001) is that integer.
  const double x = share_ * static_cast<double>(length);
  const double nearest = std::round(x);
  const double t = std::abs(x - nearest) <= 1e-9 * std::max(1.0, x) ? nearest : std::ceil(x);
  return t < 1 ? 1 : static_cast<int64_t>(t);
}

Result<PolicyBudget> ParsePolicyBudget(std::string_view text) {
  const auto malformed = [text] {
    return Status::InvalidArgument(fmt::format(
        "budget '{}': expected a token count (64), a fraction (0.25) or a percentage (25%)", text));
  };
  // The parsed budget, its range error prefixed with the text the user wrote (a percentage's
  // share would otherwise be reported as a fraction they never typed).
  const auto named = [text](Result<PolicyBudget> b) -> Result<PolicyBudget> {
    if (b.ok()) return b;
    return Status::InvalidArgument(fmt::format("budget '{}': {}", text, b.status().message()));
  };
  if (text.empty()) return malformed();
  const bool percent = text.back() == '%';
  const std::string_view number = percent ? text.substr(0, text.size() - 1) : text;
  const char* begin = number.data();
  const char* end = begin + number.size();
  // Only a written decimal point or exponent makes a fraction: "1" is one token, "1.0" the whole
  // sequence.
  if (percent || number.find_first_of(".eE") != std::string_view::npos) {
    double value = 0;
    const auto [ptr, ec] = std::from_chars(begin, end, value);
    if (ec != std::errc{} || ptr != end || !std::isfinite(value)) return malformed();
    return named(PolicyBudget::Fraction(percent ? value / 100.0 : value));
  }
  int64_t tokens = 0;
  const auto [ptr, ec] = std::from_chars(begin, end, tokens);
  if (ec != std::errc{} || ptr != end) return malformed();
  return named(PolicyBudget::Tokens(tokens));
}

}  // namespace hkv
