#include "device/runtime/generator.h"

#include <deque>
#include <mutex>

#include "device/runtime/runtime.h"

namespace zion::device {

Generator::Generator(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      cpu_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

void Generator::set_current_seed(uint64_t seed) { cpu_.set_current_seed(seed); }
// A zion generator's state is a CPU (Mersenne Twister) generator's, which has
// no Philox offset: its offset reads 0, as a CUDA generator's does after a
// seed, so torch's pickling of generators (get_offset, then set_offset on
// load) works; only an offset other than 0 is refused.
void Generator::set_offset(uint64_t offset) {
  TORCH_CHECK_NOT_IMPLEMENTED(offset == 0, "zion generator set_offset(", offset, "): a zion generator's state is a CPU "
                              "(Mersenne Twister) generator's, so that random ops draw the CPU's numbers; it has no "
                              "Philox offset as a CUDA generator has (its offset is always 0). Save and restore it with "
                              "get_state() / set_state(), or reseed it with manual_seed()");
}
uint64_t Generator::get_offset() const { return 0; }
uint64_t Generator::current_seed() const { return cpu_.current_seed(); }
uint64_t Generator::seed() { return cpu_.seed(); }
void Generator::set_state(const c10::TensorImpl& new_state) { cpu_.unsafeGetGeneratorImpl()->set_state(new_state); }
c10::intrusive_ptr<c10::TensorImpl> Generator::get_state() const { return cpu_.unsafeGetGeneratorImpl()->get_state(); }

Generator* Generator::clone_impl() const {
  auto* copy = new Generator(device_.index());
  copy->cpu_ = cpu_.clone();
  return copy;
}

const at::Generator& default_generator(c10::DeviceIndex device) {
  static std::mutex mutex;
  // A deque: references handed out stay valid when it grows.
  static std::deque<at::Generator> generators;
  check_device(device);
  std::lock_guard<std::mutex> lock(mutex);
  // Grown on demand: set_platform may bring more devices than before.
  for (auto d = static_cast<c10::DeviceIndex>(generators.size()); d < device_count(); ++d) {
    generators.push_back(at::make_generator<Generator>(d, c10::default_rng_seed_val));
  }
  return generators.at(device);
}

at::Generator cpu_generator_for(const std::optional<at::Generator>& gen, c10::DeviceIndex device) {
  if (gen.has_value() && gen->defined()) {
    // As CUDA refuses a CPU generator for a CUDA op: the script would fail
    // on the device it is written for.
    auto* z = dynamic_cast<Generator*>(gen->unsafeGetGeneratorImpl());
    TORCH_CHECK(z, "Expected a '", c10::get_privateuse1_backend(), "' device type for generator but found '",
                gen->device().str(), "' (a zion op draws from torch.Generator(device=\"", c10::get_privateuse1_backend(),
                "\") or the device's default generator)");
    return z->cpu();
  }
  return static_cast<Generator*>(default_generator(device).unsafeGetGeneratorImpl())->cpu();
}

}  // namespace zion::device
