// tessera plan's machine files (plan/machine.hpp), read by the deck's rules: each refusal one
// line at FILE:LINE:COL, numbers bounded so that no plan is NaN, no key twice; and the JSON
// the plan writes a machine's name into (io/json.hpp's json_text).
#include <gtest/gtest.h>

#include <string>

#include "common/error.hpp"
#include "io/json.hpp"
#include "plan/machine.hpp"

namespace tessera {
namespace {

const std::string kNode =
    "name: test-node\n"
    "peak_tflops_fp32: 20\n"
    "memory_gb: 64\n"
    "memory_bandwidth_gbs: 1600\n"
    "gpus_per_node: 4\n"
    "intra_node_gbs: 100\n"
    "inter_node_gbs: 25\n";

// The message parse_machine refuses `text` with, checked to be one line of bad input.
std::string machine_error(const std::string& text) {
  try {
    parse_machine(text, "m.yaml");
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.exit_code, kExitBadInput) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  ADD_FAILURE() << "no error for machine file:\n" << text;
  return "";
}

TEST(MachineFile, ReadsEveryKey) {
  const Machine m = parse_machine(kNode + "nics_per_node: 2\ngemm_tile: 64\ngpu: false\n"
                                          "latency_us: 3\n",
                                  "m.yaml");
  EXPECT_EQ(m.name, "test-node");
  EXPECT_EQ(m.peak_fp32, 20e12);
  EXPECT_EQ(m.memory, 64e9);
  EXPECT_EQ(m.devices_per_node, 4);
  EXPECT_EQ(m.nics_per_node, 2);
  EXPECT_EQ(m.gemm_tile, 64);
  EXPECT_FALSE(m.gpu);
  EXPECT_DOUBLE_EQ(m.latency, 3e-6);
  EXPECT_EQ(parse_machine("peak_tflops_fp32: 1\nmemory_gb: 1\nmemory_bandwidth_gbs: 1\n"
                          "gpus_per_node: 1\nintra_node_gbs: 1\ninter_node_gbs: 1\n",
                          "dir/m.yaml")
                .name,
            "dir/m.yaml");
}

// Each number's range, at the value; whole numbers as the deck's integers (no 3e9, no 1.5).
TEST(MachineFile, RangesAtTheValue) {
  EXPECT_EQ(machine_error(kNode + "gemm_tile: 1e300\n"),
            "m.yaml:8:12: gemm_tile: must be <= 4096 (GEMM kernels' tiles are 64 to 256 wide), "
            "got 1e+300");
  EXPECT_EQ(machine_error(kNode + "gemm_half: 1e300\n"),
            "m.yaml:8:12: gemm_half: must be <= 1e+06 (over ten times a published model's "
            "widest GEMM dimension, 53248), got 1e+300");
  EXPECT_EQ(machine_error(kNode + "memory_efficiency: 1.5\n"),
            "m.yaml:8:20: memory_efficiency: must be <= 1 (a fraction of the bandwidth), got 1.5");
  EXPECT_EQ(machine_error(kNode + "kernel_us: -1\n"), "m.yaml:8:12: kernel_us: must be >= 0, got -1");
  EXPECT_EQ(machine_error(kNode + "nics_per_node: 0\n"),
            "m.yaml:8:16: nics_per_node: must be >= 1, got 0");
  EXPECT_EQ(machine_error(kNode + "nics_per_node: 2000000\n"),
            "m.yaml:8:16: nics_per_node: must be <= 1048576 (the most ranks tessera plan takes), "
            "got 2000000");
  std::string node = kNode;
  node.replace(node.find("gpus_per_node: 4"), 16, "gpus_per_node: 3e9");
  EXPECT_EQ(machine_error(node), "m.yaml:5:16: gpus_per_node: expected an integer, got '3e9'");
  node.replace(node.find("3e9"), 3, "3000000000");
  EXPECT_EQ(machine_error(node),
            "m.yaml:5:16: gpus_per_node: expected an integer from -2147483648 to 2147483647, "
            "got '3000000000'");
  EXPECT_EQ(machine_error(kNode + "nics_per_node: 1.5\n"),
            "m.yaml:8:16: nics_per_node: expected an integer, got '1.5'");
  EXPECT_EQ(machine_error(kNode + "latency_us: .inf\n"),
            "m.yaml:8:13: latency_us: expected a number, got '.inf'");
  EXPECT_EQ(machine_error(kNode + "gpu: yes\n"), "m.yaml:8:6: gpu: expected true or false, got 'yes'");
}

// What is not a number where one belongs, a key given twice, a key that is not a name: each at
// its place in the file, never an internal error.
TEST(MachineFile, StructureAsTheDeck) {
  EXPECT_EQ(machine_error(kNode + "memory_gb: 80\n"),
            "m.yaml:8:1: memory_gb: duplicate key (first at line 3)");
  EXPECT_EQ(machine_error(kNode + "reserved_gb: [1, 2]\n"),
            "m.yaml:8:14: reserved_gb: expected a number, got a sequence");
  EXPECT_EQ(machine_error(kNode + "reserved_gb: {a: 1}\n"),
            "m.yaml:8:14: reserved_gb: expected a number, got a map");
  EXPECT_EQ(machine_error(kNode + "reserved_gb:\n"),
            "m.yaml:8:1: reserved_gb: expected a number, got nothing");
  EXPECT_EQ(machine_error("? [a, b]\n: 1\n" + kNode), "m.yaml:1:3: expected a key name, got a sequence");
  EXPECT_EQ(machine_error("- 1\n- 2\n"), "m.yaml:1:1: expected a map of keys, got a sequence");
  EXPECT_EQ(machine_error(kNode + "gpus: 4\n"),
            "m.yaml:8:1: gpus: unknown key (see input/README.md, \"Machine files\")");
  EXPECT_EQ(machine_error(""), "m.yaml:1:1: peak_tflops_fp32: missing (required)");
  EXPECT_EQ(machine_error(kNode + "name: x\n"), "m.yaml:8:1: name: duplicate key (first at line 1)");
  EXPECT_EQ(machine_error("name: \"a\\nb\"\n" + kNode.substr(kNode.find('\n') + 1)),
            "m.yaml:1:7: name: expected one line of text, got 'a\\nb'");
  EXPECT_EQ(machine_error(kNode + "name2: \"x\n"),
            "m.yaml:8:8: name2: the double-quoted value is not closed on its line (add the "
            "closing quote)");
  EXPECT_EQ(machine_error(std::string("name: a\0b\n", 10)),
            "m.yaml:1:8: a NUL byte: a machine file is text (YAML allows tab, line feed and "
            "carriage return, no other control character)");
  EXPECT_EQ(machine_error(kNode + "---\nname: b\n"), "m.yaml:9:1: expected one YAML document, found a second");
}

// A name as `plan --json` writes it, read back by a JSON parser (which refuses malformed UTF-8).
std::string round_trip(const std::string& name) {
  const std::string text = json_text(JsonRow{{"machine", name}});
  return Json::parse(text).at("machine").get<std::string>();
}

TEST(Json, NamesEscapedAndReadBack) {
  EXPECT_EQ(json_text(JsonRow{{"machine", "h100"}}), "{\"machine\":\"h100\"}");
  for (const std::string name : {"a \"b\" \\ c", "a\nb\tc\x01\x7f", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"})
    EXPECT_EQ(round_trip(name), name);
  EXPECT_EQ(json_text(JsonRow{{"m", "a\"\n\x01"}}), "{\"m\":\"a\\\"\\n\\u0001\"}");
  // Not UTF-8: a Latin-1 byte, a cut sequence, an overlong '/', a surrogate: U+FFFD in their
  // place, the rest kept.
  const std::string fffd = "\xef\xbf\xbd";
  EXPECT_EQ(round_trip("caf\xe9"), "caf" + fffd);
  for (const std::string bad : {"\xe2\x82", "\xc0\xaf", "\xed\xa0\x80"}) {
    const std::string back = round_trip("x" + bad + "y");
    EXPECT_EQ(back.front(), 'x');
    EXPECT_EQ(back.back(), 'y');
    EXPECT_NE(back.find(fffd), std::string::npos) << back;
  }
}

}  // namespace
}  // namespace tessera
