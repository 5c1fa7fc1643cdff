#include <gtest/gtest.h>

#include <cstdint>

#include "dsec/common/Prometheus.h"

namespace dsec::prometheus {
namespace {

TEST(Prometheus, EscapesLabelValues) {
  EXPECT_EQ(escapeLabelValue("plain"), "plain");
  EXPECT_EQ(escapeLabelValue("a\\b"), "a\\\\b");
  EXPECT_EQ(escapeLabelValue("say \"hi\""), "say \\\"hi\\\"");
  EXPECT_EQ(escapeLabelValue("two\nlines"), "two\\nlines");
  EXPECT_EQ(escapeHelp("a \"quoted\" \\ help\n"), "a \"quoted\" \\\\ help\\n");
}

TEST(Prometheus, WritesFamiliesAndSamples) {
  std::string out;
  counter(&out, "dsec_x_total", "Things done.", uint64_t{7});
  EXPECT_EQ(out, "# HELP dsec_x_total Things done.\n# TYPE dsec_x_total counter\ndsec_x_total 7\n");
  out.clear();
  gauge(&out, "dsec_y", "", int64_t{-3});
  EXPECT_EQ(out, "# TYPE dsec_y gauge\ndsec_y -3\n");
  out.clear();
  family(&out, "dsec_z", "gauge", "By state.");
  sample(&out, "dsec_z", {{"state", "a\"b\\c\nd"}, {"kind", "x"}}, number(0.25));
  EXPECT_EQ(out, "# HELP dsec_z By state.\n# TYPE dsec_z gauge\ndsec_z{state=\"a\\\"b\\\\c\\nd\",kind=\"x\"} 0.25\n");
}

TEST(Prometheus, FormatsNumbers) {
  EXPECT_EQ(number(uint64_t{18446744073709551615ULL}), "18446744073709551615");
  EXPECT_EQ(number(-1), "-1");
  EXPECT_EQ(number(1.5), "1.5");
  EXPECT_EQ(number(1e-7), "1e-07");
  EXPECT_EQ(number(true), "1");
}

}  // namespace
}  // namespace dsec::prometheus
