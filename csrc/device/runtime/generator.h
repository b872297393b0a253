#pragma once
// Random numbers on zion: each device has a generator whose state is a CPU
// generator's, so random ops run by the CPU kernels draw exactly the CPU
// sequence for the same seed.

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

namespace zion::device {

class Generator final : public c10::GeneratorImpl {
 public:
  explicit Generator(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val);

  // The CPU generator that CPU kernels are handed in place of this one.
  at::Generator cpu() const { return cpu_; }

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

 private:
  Generator* clone_impl() const override;
  at::Generator cpu_;
};

const at::Generator& default_generator(c10::DeviceIndex device);
// For a generator argument of a zion op: the CPU generator to use instead
// (the device's default when `gen` is undefined). A generator of another
// device, the CPU's included, is refused, as CUDA refuses one.
at::Generator cpu_generator_for(const std::optional<at::Generator>& gen, c10::DeviceIndex device);

}  // namespace zion::device
