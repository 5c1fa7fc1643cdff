#include "dsec/launcher/api/E2bFront.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cmath>
#include <ctime>

#include "E2bText.h"
#include "dsec/common/Endpoint.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerRef.h"
#include "dsec/launcher/api/HttpClient.h"
#include "dsec/launcher/api/Requests.h"
#include "dsec/launcher/api/Router.h"

namespace dsec::launcher {
namespace {

namespace http = boost::beast::http;
using e2b::header;

constexpr uint64_t kBodyLimit = 1 << 20;
constexpr const char* kTemplateLabel = "e2b_template";
constexpr double kDefaultTimeoutSeconds = 300;  // E2B's default sandbox lifetime

void sendE2bError(HttpExchange& ex, int status, const std::string& message, const HttpExchange::Fields& extra = {}) {
  ex.sendJson(status, nlohmann::json{{"code", status}, {"message", message}}, extra);
}

// A dsec sandbox info as E2B's ListedSandbox / SandboxDetail.
nlohmann::json e2bSandbox(const nlohmann::json& info, const std::string& token) {
  const std::string id = info.value("id", "");
  nlohmann::json metadata = nlohmann::json::object();
  std::string template_id = info.value("image", "");
  if (info.contains("labels") && info["labels"].is_object()) {
    for (const auto& [k, v] : info["labels"].items()) {
      if (k == kTemplateLabel) {
        template_id = v.get<std::string>();
      } else {
        metadata[k] = v;
      }
    }
  }
  const double created = info.value("created_unix", 0.0);
  const double timeout = info.value("timeout", 0.0);
  const double end = timeout > 0 ? created + timeout : created + 10.0 * 365 * 86400;
  const std::string state = info.value("state", "running") == "paused" ? "paused" : "running";
  return nlohmann::json{{"sandboxID", id},
                        {"templateID", template_id},
                        {"alias", template_id},
                        {"clientID", "dsec"},
                        {"startedAt", rfc3339(created)},
                        {"endAt", rfc3339(end)},
                        {"state", state},
                        {"cpuCount", static_cast<int>(std::ceil(info.value("cpus", 1.0)))},
                        {"memoryMB", info.value("memory", int64_t{0}) >> 20},
                        {"diskSizeMB", info.value("disk", int64_t{0}) >> 20},
                        {"metadata", metadata},
                        {"envdVersion", kE2bEnvdVersion},
                        {"envdAccessToken", E2bFront::envdAccessToken(token, id)}};
}

enum Route { kCreate, kList, kGet, kKill, kTimeout, kConnect, kPause, kUnsupported };

const RouteTable& controlRoutes() {
  using V = http::verb;
  static const RouteTable table = RouteTable()
                                      .add("/v2/sandboxes", {{V::post, kCreate}, {V::get, kList}})
                                      .add("/sandboxes", {{V::post, kCreate}, {V::get, kList}})
                                      .add("/v2/sandboxes/*/connect", {{V::post, kConnect}})
                                      .add("/sandboxes/*/connect", {{V::post, kConnect}})
                                      .add("/sandboxes/*/resume", {{V::post, kConnect}})
                                      .add("/sandboxes/*/timeout", {{V::post, kTimeout}})
                                      .add("/sandboxes/*/pause", {{V::post, kPause}})
                                      .add("/sandboxes/*", {{V::get, kGet}, {V::delete_, kKill}})
                                      .addAnyMethod("/**", kUnsupported);
  return table;
}

}  // namespace

Status addE2bTemplate(E2bOptions& options, const std::string& spec) {
  const auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
    return Error::invalid("--e2b-template takes NAME=IMAGE, not '" + spec + "'");
  }
  options.templates[spec.substr(0, eq)] = spec.substr(eq + 1);
  return okStatus();
}

Status validateE2bOptions(const E2bOptions& options, const std::string& flag_prefix) {
  if (!options.listen.empty()) {
    if (auto address = parseListenAddress(options.listen); !address.ok()) {
      return Error::invalid("--" + flag_prefix + "e2b-listen: " + address.error().message());
    }
  }
  for (const auto& [name, image] : options.templates) {
    if (auto ref = fs3::parseImageRef(image); !ref.ok()) {
      return Error::invalid("--" + flag_prefix + "e2b-template: " + name + ": " + ref.error().message());
    }
  }
  if (!options.default_image.empty()) {
    if (auto ref = fs3::parseImageRef(options.default_image); !ref.ok()) {
      return Error::invalid("--" + flag_prefix + "e2b-default-image: " + ref.error().message());
    }
  }
  return okStatus();
}

E2bFront::E2bFront(E2bOptions options, std::string upstream, std::string token)
    : options_(std::move(options)), upstream_(std::move(upstream)), token_(std::move(token)) {}

std::string E2bFront::envdAccessToken(const std::string& token, const std::string& sandbox_id) {
  const std::string message = "envd:" + sandbox_id;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  ::HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
         reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &length);
  return hexEncode(std::string_view(reinterpret_cast<const char*>(mac), length));
}

std::string E2bFront::imageFor(const std::string& template_id) const {
  if (auto it = options_.templates.find(template_id); it != options_.templates.end()) return it->second;
  return options_.default_image;
}

E2bFront::Upstream E2bFront::call(http::verb method, const std::string& target, const std::string& body) {
  client::CallOptions options;
  options.pool = &pool_;
  options.io_timeout_ms = 600 * 1000;  // a create may wait for its image's first mount
  options.all_headers = true;
  if (!body.empty()) options.headers.emplace_back("Content-Type", "application/json");
  auto reply = client::call(upstream_, method, target, token_, body, options);
  if (!reply.ok()) return Upstream{503, nlohmann::json{{"error", {{"message", reply.error().message()}}}}.dump(), {}};
  return Upstream{reply->status, std::move(reply->body), std::move(reply->headers)};
}

void E2bFront::relayError(HttpExchange& ex, const Upstream& answer) {
  auto j = nlohmann::json::parse(answer.body, nullptr, false);
  std::string message = "dsec answered HTTP " + std::to_string(answer.status);
  if (j.is_object() && j.contains("error") && j["error"].is_object()) message = j["error"].value("message", message);
  HttpExchange::Fields extra;
  for (const auto& [k, v] : answer.headers) {
    if (boost::beast::iequals(k, "Retry-After")) extra.emplace_back("Retry-After", v);
  }
  sendE2bError(ex, answer.status, message, extra);
}

void E2bFront::handle(HttpExchange& ex) {
  const std::string sandbox = header(ex, "E2b-Sandbox-Id");
  if (!sandbox.empty()) return envd(ex, sandbox);
  controlPlane(ex);
}

void E2bFront::controlPlane(HttpExchange& ex) {
  if (!constantTimeEquals(header(ex, "X-API-KEY"), token_) || token_.empty()) {
    if (ex.hasBody()) ex.forceClose();
    return sendE2bError(ex, 401, "invalid API key: use the dsec fleet's token as E2B_API_KEY");
  }
  ex.markAuthenticated();
  TableMatch m = controlRoutes().match(ex.method(), ex.target());
  if (m.error_status != 0) return sendE2bError(ex, m.error_status, m.error);
  const std::string id = m.wildcards.empty() || m.route == kUnsupported ? "" : m.wildcards[0];
  if (!id.empty() && !validSandboxId(id)) return sendE2bError(ex, 404, "sandbox " + id + " not found");
  const std::string path = "/v1/sandboxes/" + id;
  switch (m.route) {
    case kCreate:
      return createSandbox(ex);
    case kList:
      return listSandboxes(ex, m.query);
    case kGet: {
      auto answer = call(http::verb::get, path, "");
      if (answer.status != 200) return relayError(ex, answer);
      return ex.sendJson(200, e2bSandbox(nlohmann::json::parse(answer.body, nullptr, false), token_));
    }
    case kKill: {
      auto answer = call(http::verb::delete_, path, "");
      if (answer.status / 100 != 2) return relayError(ex, answer);
      return ex.sendText(204, "application/json", "");
    }
    case kTimeout: {
      bool too_large = false;
      auto body = ex.readBody(kBodyLimit, &too_large);
      if (!body.ok()) return sendE2bError(ex, too_large ? 413 : 400, body.error().message());
      auto j = nlohmann::json::parse(*body, nullptr, false);
      if (!j.is_object() || !j.contains("timeout") || !j["timeout"].is_number()) {
        return sendE2bError(ex, 400, "the body is {\"timeout\": SECONDS}");
      }
      auto answer = call(http::verb::put, path + "/timeout", nlohmann::json{{"timeout", j["timeout"]}}.dump());
      if (answer.status != 200) return relayError(ex, answer);
      return ex.sendText(204, "application/json", "");
    }
    case kConnect:
      return connectSandbox(ex, id);
    case kPause: {
      auto answer = call(http::verb::post, path + "/pause", "");
      if (answer.status != 200) return relayError(ex, answer);
      return ex.sendText(204, "application/json", "");
    }
    default:
      if (ex.hasBody() && !ex.discardBody(kBodyLimit)) ex.forceClose();
      return sendE2bError(ex, 501,
                          std::string(ex.target().substr(0, 200)) +
                              " is not supported by dsec's E2B listener (docs/e2b.md lists what is)");
  }
}

void E2bFront::createSandbox(HttpExchange& ex) {
  bool too_large = false;
  auto body = ex.readBody(kBodyLimit, &too_large);
  if (!body.ok()) return sendE2bError(ex, too_large ? 413 : 400, body.error().message());
  auto j = nlohmann::json::parse(*body, nullptr, false);
  if (!j.is_object()) return sendE2bError(ex, 400, "the body is not a JSON object");
  const std::string template_id = j.contains("templateID") && j["templateID"].is_string()
                                      ? j["templateID"].get<std::string>()
                                      : std::string("base");
  const std::string image = imageFor(template_id);
  if (image.empty()) {
    return sendE2bError(ex, 400,
                        "template '" + template_id +
                            "' is not served here: the operator maps templates to dsec "
                            "images with --e2b-template NAME=IMAGE (or --e2b-default-image)");
  }
  nlohmann::json create{{"image", image}};
  nlohmann::json labels = nlohmann::json::object();
  if (j.contains("metadata") && j["metadata"].is_object()) labels = j["metadata"];
  labels[kTemplateLabel] = template_id;
  create["labels"] = labels;
  if (j.contains("envVars") && j["envVars"].is_object()) create["env"] = j["envVars"];
  create["timeout"] =
      j.contains("timeout") && j["timeout"].is_number() ? j["timeout"] : nlohmann::json(kDefaultTimeoutSeconds);
  if (j.contains("allow_internet_access") && j["allow_internet_access"].is_boolean() &&
      j["allow_internet_access"].get<bool>()) {
    return sendE2bError(ex, 400,
                        "allow_internet_access: dsec sandboxes have no network unless an egress policy allows it "
                        "(docs/e2b.md); create without it");
  }
  auto answer = call(http::verb::post, "/v1/sandboxes", create.dump());
  if (answer.status != 201 && answer.status != 200) return relayError(ex, answer);
  auto info = nlohmann::json::parse(answer.body, nullptr, false);
  const std::string id = info.value("id", "");
  ex.sendJson(201, nlohmann::json{{"sandboxID", id},
                                  {"templateID", template_id},
                                  {"alias", template_id},
                                  {"clientID", "dsec"},
                                  {"envdVersion", kE2bEnvdVersion},
                                  {"envdAccessToken", envdAccessToken(token_, id)}});
}

void E2bFront::listSandboxes(HttpExchange& ex, const QueryParams& query) {
  std::string target = "/v1/sandboxes";
  // metadata is itself a query string of the filters, and E2B's SDK escapes each key and value before it builds it
  // (encodeURIComponent, then URLSearchParams, then the request's own query encoding): the route decoded the
  // parameter once, parseQuery splits and decodes the pairs, and each key and value is decoded once more here.
  auto filters = parseQuery(query.get("metadata"));
  if (!filters.ok()) return sendE2bError(ex, 400, "metadata: " + filters.error().message());
  char sep = '?';
  for (const auto& [encoded_key, encoded_value] : filters->values) {
    std::string key, value;
    if (!percentDecode(encoded_key, &key) || !percentDecode(encoded_value, &value)) {
      return sendE2bError(ex, 400, "metadata: bad percent-encoding in '" + encoded_key + "'");
    }
    target += sep;
    target += "label=" + percentEncode(key + "=" + value);
    sep = '&';
  }
  auto answer = call(http::verb::get, target, "");
  if (answer.status != 200) return relayError(ex, answer);
  auto j = nlohmann::json::parse(answer.body, nullptr, false);
  nlohmann::json out = nlohmann::json::array();
  const std::string state = query.get("state");
  if (j.is_object() && j.contains("sandboxes")) {
    for (const auto& info : j["sandboxes"]) {
      auto sandbox = e2bSandbox(info, token_);
      if (!state.empty() && state.find(sandbox["state"].get<std::string>()) == std::string::npos) continue;
      out.push_back(std::move(sandbox));
    }
  }
  ex.sendJson(200, out);  // one page: no x-next-token
}

void E2bFront::connectSandbox(HttpExchange& ex, const std::string& id) {
  bool too_large = false;
  auto body = ex.readBody(kBodyLimit, &too_large);
  if (!body.ok()) return sendE2bError(ex, too_large ? 413 : 400, body.error().message());
  auto j = nlohmann::json::parse(body->empty() ? "{}" : *body, nullptr, false);
  const std::string path = "/v1/sandboxes/" + id;
  auto answer = call(http::verb::post, path + "/resume", "");  // running or paused: it runs after this
  if (answer.status != 200) return relayError(ex, answer);
  if (j.is_object() && j.contains("timeout") && j["timeout"].is_number()) {
    answer = call(http::verb::put, path + "/timeout", nlohmann::json{{"timeout", j["timeout"]}}.dump());
    if (answer.status != 200) return relayError(ex, answer);
  }
  auto sandbox = e2bSandbox(nlohmann::json::parse(answer.body, nullptr, false), token_);
  ex.sendJson(200, nlohmann::json{{"sandboxID", id},
                                  {"templateID", sandbox["templateID"]},
                                  {"alias", sandbox["templateID"]},
                                  {"clientID", "dsec"},
                                  {"envdVersion", kE2bEnvdVersion},
                                  {"envdAccessToken", envdAccessToken(token_, id)}});
}

}  // namespace dsec::launcher
