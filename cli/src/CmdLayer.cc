// dsec layer build|ls|rm|push: works directly on the local layer store at --root and the shared store at --store
// (no server needed).
#include <iostream>
#include <nlohmann/json.hpp>

#include "Commands.h"
#include "LayerBuild.h"
#include "Progress.h"
#include "SharedStoreCommands.h"
#include "Table.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerRef.h"
#include "dsec/fs3/LayerStore.h"

namespace dsec::cli {

namespace {

fs3::LayerRef parseRefArg(const std::string& text) {
  auto ref = fs3::parseLayerRef(text);
  if (!ref.ok()) throw UsageError(ref.error().message());
  return *ref;
}

void printScrubbed(const std::vector<fs3::ScrubbedRepository>& scrubbed) {
  if (scrubbed.empty()) std::cout << "--scrub-git: no git repository found; nothing to scrub\n";
  for (const auto& repo : scrubbed) {
    std::cout << "scrubbed git repository " << repo.path << ": one commit " << repo.commit.substr(0, 12)
              << (repo.branch.empty() ? " (detached HEAD)" : " on branch " + repo.branch)
              << "; no history, other refs, reflogs, stash, remotes or hooks\n";
  }
}

void printManifest(const fs3::LayerManifest& m) {
  std::cout << "built " << m.ref.toString() << " (" << formatBytes(m.size) << ", sha256 " << m.sha256.substr(0, 16)
            << (m.built_on.empty() ? "" : ", on " + m.built_on) << ")\n";
}

int layerBuild(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, false);
  desc.add_options()("ref", po::value<std::string>()->required(), "NAME:VERSION of the new layer")(
      "from-dir", po::value<std::string>(), "make the layer from this directory tree")(
      "debootstrap", po::value<std::string>(), "make a Debian base layer: debootstrap --variant=minbase SUITE")(
      "mirror", po::value<std::string>(), "with --debootstrap: the Debian mirror URL")(
      "on", po::value<std::string>(), "with --run: the image to run on, e.g. debian:12")(
      "run", po::value<std::string>(), "with --on: shell command whose file changes become the layer")(
      "scrub-git", po::bool_switch(),
      "with --from-dir or --run: replace each git repository by one commit of its working tree (no history)")(
      "store", po::value<std::string>()->default_value(defaultStore()),
      "also push the layer to this shared layer store (env DSEC_STORE; '' : do not)")(
      "chunk-size", po::value<std::string>()->default_value("128K"), "with --store: the chunk size");
  po::positional_options_description positional;
  positional.add("ref", 1);
  po::variables_map vm;
  if (!parseCommandLine(
          inv, inv.args, desc, positional,
          "NAME:VERSION (--from-dir DIR | --debootstrap SUITE [--mirror URL] | --on IMAGE --run CMD) [--scrub-git]",
          &vm, &common)) {
    return kExitOk;
  }
  fs3::LayerRef ref = parseRefArg(vm["ref"].as<std::string>());
  int sources = static_cast<int>(vm.count("from-dir") + vm.count("debootstrap") + vm.count("run"));
  if (sources != 1) throw UsageError("give exactly one of --from-dir, --debootstrap, --on/--run");
  if ((vm.count("on") != 0) != (vm.count("run") != 0)) throw UsageError("--on and --run go together");
  if (vm.count("mirror") != 0 && vm.count("debootstrap") == 0) throw UsageError("--mirror needs --debootstrap");
  bool scrub_git = vm["scrub-git"].as<bool>();
  if (scrub_git && vm.count("debootstrap") != 0) {
    throw UsageError(
        "--scrub-git goes with --from-dir or --on/--run, not --debootstrap (a Debian base has no repository)");
  }
  // Checked before a build that may take minutes.
  if (scrub_git && findProgram("git").empty()) {
    return reportError(inv, Error(ErrorCode::kUnsupported, "--scrub-git: git not found on PATH (install git)"));
  }
  if (vm.count("on") != 0) {
    auto image = fs3::parseImageRef(vm["on"].as<std::string>());
    if (!image.ok()) throw UsageError("--on: " + image.error().message());
  }
  const std::string store_dir = vm["store"].as<std::string>();
  auto chunk_size = parseByteSize(vm["chunk-size"].as<std::string>());
  if (!chunk_size.ok()) throw UsageError("--chunk-size: " + chunk_size.error().message());

  fs3::LayerStore store(common.root);
  Progress progress("layer build " + ref.toString());
  store.setBuildProgress({[&progress](const std::string& step) { progress.step(step); },
                          [&progress](std::string_view detail) { progress.detail(detail); }});
  Result<fs3::LayerManifest> built = Error::internal("no source");
  if (vm.count("from-dir") != 0) {
    std::string dir = vm["from-dir"].as<std::string>();
    if (scrub_git) {
      std::vector<fs3::ScrubbedRepository> scrubbed;
      built = buildLayerFromDirScrubbingGit(store, ref, dir, &scrubbed);
      if (built.ok()) printScrubbed(scrubbed);
    } else {
      built = store.buildFromDir(ref, dir, "", "dir:" + dir);
    }
  } else if (vm.count("debootstrap") != 0) {
    std::string mirror = vm.count("mirror") != 0 ? vm["mirror"].as<std::string>() : "";
    built = store.buildDebootstrap(ref, vm["debootstrap"].as<std::string>(), mirror);
  } else {
    auto outcome =
        buildLayerByRunning(store, ref, vm["on"].as<std::string>(), vm["run"].as<std::string>(), scrub_git, &progress);
    if (!outcome.ok()) return reportError(inv, outcome.error());
    if (outcome->exit_code != 0) {
      reportError(inv, "the command exited with " + std::to_string(outcome->exit_code) + "; no layer was built");
      return outcome->exit_code > 0 && outcome->exit_code < 256 ? outcome->exit_code : kExitFailure;
    }
    if (scrub_git) printScrubbed(outcome->scrubbed);
    built = outcome->manifest;
  }
  if (!built.ok()) return reportError(inv, built.error());
  progress.finish();
  printManifest(*built);
  if (!store_dir.empty()) {
    if (Status pushed = pushLayer(store, ref, store_dir, *chunk_size); !pushed.ok())
      return reportError(inv, pushed.error());
  }
  return kExitOk;
}

int layerLs(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, false);
  desc.add_options()("json", po::bool_switch(), "print the manifests as JSON")(
      "store", po::value<std::string>(), "list the shared layer store at this directory instead of the node's");
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, {}, "", &vm, &common)) return kExitOk;
  if (vm.count("store") != 0) return layerLsStore(inv, vm["store"].as<std::string>(), vm["json"].as<bool>());
  fs3::LayerStore store(common.root);
  auto layers = store.list();
  if (!layers.ok()) return reportError(inv, layers.error());
  if (vm["json"].as<bool>()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& m : *layers) {
      out.push_back(m.toJson());
    }
    std::cout << nlohmann::json{{"layers", out}}.dump(2) << "\n";
    return kExitOk;
  }
  Table table({"NAME:VERSION", "SIZE", "CREATED", "BUILT_ON"});
  for (const auto& m : *layers) {
    table.add({m.ref.toString(), formatBytes(m.size), m.created, m.built_on.empty() ? "-" : m.built_on});
  }
  table.print(std::cout);
  return kExitOk;
}

int layerRm(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, false);
  desc.add_options()("ref", po::value<std::vector<std::string>>(), "NAME:VERSION of the layers to remove")(
      "store", po::value<std::string>(), "remove them from this shared layer store instead of the node's");
  po::positional_options_description positional;
  positional.add("ref", -1);
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, positional, "NAME:VERSION... [--store DIR]", &vm, &common)) {
    return kExitOk;
  }
  if (vm.count("ref") == 0) throw UsageError("missing NAME:VERSION");
  std::vector<fs3::LayerRef> refs;
  for (const auto& text : vm["ref"].as<std::vector<std::string>>()) refs.push_back(parseRefArg(text));
  if (vm.count("store") != 0) return layerRmStore(inv, refs, vm["store"].as<std::string>());
  fs3::LayerStore store(common.root);
  int status = kExitOk;
  for (const auto& ref : refs) {
    if (isLayerMounted(store, ref)) {
      status = reportError(inv, "layer " + ref.toString() + " is in use (mounted at " + store.root() + "/mnt/" +
                                    ref.name + "/" + ref.version + "); destroy the sandboxes using it first");
      continue;
    }
    Status removed = store.remove(ref);
    if (!removed.ok()) {
      status = reportError(inv, removed.error());
      continue;
    }
    std::cout << "removed " << ref.toString() << "\n";
  }
  return status;
}

}  // namespace

int cmdLayer(const Invocation& inv) {
  static const std::pair<const char*, int (*)(const Invocation&)> kSubcommands[] = {
      {"build", layerBuild},       {"ls", layerLs},     {"rm", layerRm}, {"push", layerPush},
      {"prefetch", layerPrefetch}, {"pull", layerPull}, {"gc", layerGc}, {"serve", layerServe}};
  if (inv.args.empty() || inv.args[0] == "--help" || inv.args[0] == "-h") {
    std::ostream& out = inv.args.empty() ? std::cerr : std::cout;
    out << "usage: dsec layer build NAME:VERSION (--from-dir DIR | --debootstrap SUITE [--mirror URL] |\n"
           "                                      --on IMAGE --run CMD) [--scrub-git] [--store DIR]\n"
           "       dsec layer ls [--store DIR]\n"
           "       dsec layer rm NAME:VERSION... [--store DIR]\n"
           "       dsec layer push NAME:VERSION... --store DIR [--chunk-size 128K]\n"
           "       dsec layer prefetch IMAGE --store DIR|URL [--all]\n"
           "       dsec layer pull IMAGE --store DIR|URL\n"
           "       dsec layer gc --store DIR [--grace 3600] [--dry-run]\n"
           "       dsec layer serve --store DIR [--listen 127.0.0.1:8480] [--latency-ms N] [--accept-recordings]\n"
           "Layers live in <root>/layers (--root, default $DSEC_ROOT or /var/lib/dsec); the cluster's shared store,\n"
           "which nodes read on demand, is --store (default $DSEC_STORE).\n";
    if (inv.args.empty()) throw UsageError("missing layer command (build, ls, rm, push, prefetch, pull, gc, serve)");
    return kExitOk;
  }
  for (const auto& [name, run] : kSubcommands) {
    if (inv.args[0] != name) continue;
    Invocation sub{"layer " + inv.args[0], inv.globals, std::vector<std::string>(inv.args.begin() + 1, inv.args.end())};
    try {
      return run(sub);
    } catch (const UsageError& e) {  // named after the full command: "dsec layer build: ..."
      std::cerr << "dsec " << sub.name << ": " << e.what() << "\n(see `dsec " << sub.name << " --help`)\n";
      return kExitUsage;
    }
  }
  throw UsageError("unknown layer command '" + inv.args[0] + "' (build, ls, rm, push, prefetch, pull, gc, serve)");
}

}  // namespace dsec::cli
