// HTTP heads and bodies: the bytes a client sends on one connection, framed as the front frames
// them (server/http_front.h: head size, Content-Length, chunked, Expect), then each complete
// request handed to cpp-httplib's request parser from memory as the front hands it, with a
// handler that reads the body as the server's routes do. Pipelined requests follow one another.
// The framing must not depend on how the bytes were split into reads: each prefix is framed too.
#include <httplib.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "fuzz_common.h"
#include "server/api.h"
#include "server/http_front.h"

using namespace flashmap;
using server::Framing;

namespace {

constexpr size_t kMaxHead = 4096, kMaxBody = 8192;

// httplib's view of a request already in memory; what it writes is kept and dropped.
class MemoryStream : public httplib::Stream {
 public:
  explicit MemoryStream(std::string_view in) : in_(in) {}
  bool is_readable() const override { return pos_ < in_.size(); }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, in_.size() - pos_);
    std::memcpy(ptr, in_.data() + pos_, n);
    pos_ += n;
    return ssize_t(n);
  }
  ssize_t write(const char*, size_t size) override {
    written_ += size;
    return ssize_t(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 1;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 2;
  }
  socket_t socket() const override { return INVALID_SOCKET; }

 private:
  std::string_view in_;
  size_t pos_ = 0;
  size_t written_ = 0;
};

class Parser : public httplib::Server {
 public:
  Parser() {
    set_payload_max_length(kMaxBody);
    Post(".*", [](const httplib::Request& req, httplib::Response& res) {
      try {
        res.set_content(server::dump_json(server::parse_json_body(req.body)), "application/json");
      } catch (const server::ApiError& e) {
        res.status = e.status;
      }
    });
    Get(".*", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content(server::printable(req.path) + server::printable(req.get_header_value("a")),
                      "text/plain");
    });
  }
  bool parse(std::string_view request) {
    MemoryStream s(request);
    bool closed = false;
    return process_request(s, false, closed, nullptr);
  }
};

void same_framing(const Framing& a, const Framing& b, size_t prefix) {
  FUZZ_REQUIRE(a.kind == b.kind && a.status == b.status && a.head_bytes == b.head_bytes &&
                   a.body_bytes == b.body_bytes,
               "framing after {} bytes differs from the whole stream's", prefix);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  static Parser* parser = new Parser;
  std::string stream(reinterpret_cast<const char*>(data), size);
  fuzz::Picker pick(stream);
  for (int request = 0; request < 8 && !stream.empty(); ++request) {
    const Framing whole = server::frame_request(stream, kMaxHead, kMaxBody);
    // Every prefix that the front might have seen first (reads of any size) frames as
    // incomplete or as the whole does.
    for (size_t cut = 1 + pick.next() % 64; cut < stream.size(); cut += 1 + pick.next() % 512) {
      const Framing part = server::frame_request(std::string_view(stream).substr(0, cut), kMaxHead,
                                                 kMaxBody);
      if (part.kind == Framing::Kind::Incomplete) continue;
      same_framing(part, whole, cut);
    }
    if (whole.kind != Framing::Kind::Complete) break;
    FUZZ_REQUIRE(whole.head_bytes <= kMaxHead && whole.body_bytes <= kMaxBody,
                 "a request over the limits was framed as complete");
    if (whole.expect_continue) {
      FUZZ_REQUIRE(whole.expect_at + whole.expect_len <= whole.head_bytes,
                   "the Expect line lies outside the head");
      stream.erase(whole.expect_at, whole.expect_len);
    }
    const size_t head = whole.head_bytes - (whole.expect_continue ? whole.expect_len : 0);
    const size_t need = head + size_t(whole.body_bytes);
    if (stream.size() < need) break;  // the front waits for the rest
    fuzz::expect_clean("httplib", [&] { (void)parser->parse(std::string_view(stream).substr(0, need)); });
    stream.erase(0, need);
  }
  return 0;
}
