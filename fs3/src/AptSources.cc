#include "AptSources.h"

#include <algorithm>
#include <sstream>
#include <vector>

#include "dsec/common/Directory.h"
#include "dsec/common/Strings.h"

namespace dsec::fs3 {
namespace {

bool usable(const std::string& url) {
  return (startsWith(url, "http://") || startsWith(url, "https://")) && url.find("security") == std::string::npos;
}

// One-line format: "deb [opts] URL SUITE COMPONENTS...".
void fromListFile(const std::string& text, std::vector<std::string>* out) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    std::string word;
    if (!(in >> word) || word != "deb") continue;
    while (in >> word) {
      if (word.front() == '[') {
        while (word.back() != ']' && (in >> word)) {
        }
        continue;
      }
      if (usable(word)) out->push_back(word);
      break;
    }
  }
}

// deb822 format: stanzas separated by blank lines with "Types: deb" and "URIs: URL...".
void fromSourcesFile(const std::string& text, std::vector<std::string>* out) {
  std::istringstream lines(text + "\n\n");
  std::string line;
  bool is_deb = false;
  bool enabled = true;
  std::vector<std::string> uris;
  while (std::getline(lines, line)) {
    std::string t = trim(line);
    if (t.empty()) {
      if (is_deb && enabled) {
        for (const auto& u : uris) {
          if (usable(u)) out->push_back(u);
        }
      }
      is_deb = false;
      enabled = true;
      uris.clear();
      continue;
    }
    if (t[0] == '#') continue;
    auto colon = t.find(':');
    if (colon == std::string::npos) continue;
    std::string key = t.substr(0, colon);
    std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return std::tolower(c); });
    std::istringstream values(t.substr(colon + 1));
    std::string v;
    if (key == "types") {
      while (values >> v) is_deb = is_deb || v == "deb";
    } else if (key == "uris") {
      while (values >> v) uris.push_back(v);
    } else if (key == "enabled") {
      enabled = values >> v && v != "no";
    }
  }
}

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string hostAptMirror(const std::string& etc_apt) {
  std::vector<std::string> urls;
  if (auto text = readFile(etc_apt + "/sources.list"); text.ok()) fromListFile(*text, &urls);
  std::string dir_path = etc_apt + "/sources.list.d";
  std::vector<std::string> names;
  if (auto entries = listDirectory(dir_path); entries.ok()) {
    for (auto& ent : *entries) names.push_back(std::move(ent.name));
  }
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    bool list = endsWith(name, ".list");
    if (!list && !endsWith(name, ".sources")) continue;  // also skips *.disabled, *.save
    auto text = readFile(dir_path + "/" + name);
    if (!text.ok()) continue;
    if (list) {
      fromListFile(*text, &urls);
    } else {
      fromSourcesFile(*text, &urls);
    }
  }
  // Third-party repositories (e.g. a cloud SDK's) are listed too: prefer the Debian archive itself.
  for (const auto& u : urls) {
    std::string path = u;
    while (!path.empty() && path.back() == '/') path.pop_back();
    if (endsWith(path, "/debian")) return u;
  }
  return urls.empty() ? "" : urls.front();
}

}  // namespace dsec::fs3
