#include "tier_command.h"

#include <ostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hkv/common/byte_size.h>
#include <hkv/connector/disk_tier.h>

namespace hkv::cli {

TierCommands AddTierCommand(CLI::App& app, TierArgs& args) {
  CLI::App* tier = app.add_subcommand("tier", "Inspect and manage a disk tier directory");
  tier->require_subcommand(1);
  TierCommands c;
  c.list = tier->add_subcommand("list", "The models a disk tier directory holds");
  c.list->add_option("dir", args.dir, "the directory given to the disk tier")->required();
  c.list->add_flag("--json", args.json, "print JSON");
  c.drop = tier->add_subcommand("drop", "Remove one model's entries from a disk tier directory");
  c.drop->add_option("dir", args.dir, "the directory given to the disk tier")->required();
  c.drop->add_option("model", args.model, "the model's identity, as `hkv tier list` prints it")
      ->required();
  return c;
}

namespace {

int List(const TierArgs& args, std::ostream& out, std::ostream& err) {
  const Result<std::vector<DiskTierModel>> models = DiskTier::List(args.dir);
  if (!models.ok()) {
    err << "hkv tier list: " << models.status().ToString() << "\n";
    return 2;
  }
  if (args.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const DiskTierModel& m : *models) {
      j.push_back({{"model", m.model.Hex()},
                   {"label", m.label},
                   {"entries", m.entries},
                   {"bytes", m.bytes},
                   {"in_use", m.in_use}});
    }
    out << j.dump(2) << "\n";
    return 0;
  }
  if (models->empty()) out << fmt::format("{}: no models\n", args.dir);
  for (const DiskTierModel& m : *models) {
    out << fmt::format("{}  {:>8} entries  {:>10}  {}{}\n", m.model.Hex(), m.entries,
                       FormatBytes(m.bytes), m.in_use ? "[in use] " : "",
                       m.label.empty() ? "(no label)" : m.label);
  }
  return 0;
}

int Drop(const TierArgs& args, std::ostream& out, std::ostream& err) {
  const Result<ModelIdentity> model = ModelIdentity::FromHex(args.model);
  if (!model.ok()) {
    err << "hkv tier drop: " << model.status().ToString() << "\n";
    return 2;
  }
  if (const Status s = DiskTier::Drop(args.dir, *model); !s.ok()) {
    err << "hkv tier drop: " << s.ToString() << "\n";
    return 2;
  }
  out << fmt::format("dropped model {} from {}\n", model->Hex(), args.dir);
  return 0;
}

}  // namespace

int RunTierCommand(const TierCommands& commands, const TierArgs& args, std::ostream& out,
                   std::ostream& err) {
  if (commands.list->parsed()) return List(args, out, err);
  return Drop(args, out, err);
}

}  // namespace hkv::cli
