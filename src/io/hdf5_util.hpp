#pragma once
// Small checked wrappers over the HDF5 C API: handles that close themselves, and attribute
// helpers. Every failure names the file and the object.
#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

namespace tessera {

// Owns one hid_t and closes it with the right H5*close.
class H5Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Handle() = default;
  H5Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  H5Handle(H5Handle&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = H5I_INVALID_HID; }
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      closer_ = o.closer_;
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  ~H5Handle() { reset(); }
  void reset() {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = H5I_INVALID_HID;
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Hands the id over without closing it (for a close whose result matters).
  hid_t release() {
    const hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// Debian's parallel HDF5 is not thread-safe: a thread that may call HDF5 while another does (the
// background checkpoint writer, train/async_writer.hpp; a chunked token file's reads) holds this.
std::mutex& hdf5_mutex();

// Turns off HDF5's own error-stack printing: tessera reports errors itself, in one line.
void hdf5_quiet();
// No HDF5 clean-up at exit (H5dont_atexit; before any other HDF5 call): after a collective write
// failed on some ranks, the library's atexit close of a file still open would enter collectives
// the others never join, and the process would hang instead of exiting.
void hdf5_no_atexit();

// Why the last HDF5 call on this thread failed, in a few words from its error stack (the system's
// own reason where HDF5 recorded one: "Permission denied", "No space left on device"); then
// clears the stack.
std::string h5_error_reason();

bool h5_has_attr(hid_t obj, const std::string& name);
std::optional<std::string> h5_read_string_attr(hid_t obj, const std::string& name);
std::optional<int64_t> h5_read_int_attr(hid_t obj, const std::string& name);
std::optional<double> h5_read_double_attr(hid_t obj, const std::string& name);
// Writers: every rank calls them with the same value (attributes are collective metadata).
void h5_write_string_attr(hid_t obj, const std::string& name, const std::string& value);
void h5_write_int_attr(hid_t obj, const std::string& name, int64_t value);
void h5_write_double_attr(hid_t obj, const std::string& name, double value);

}  // namespace tessera
