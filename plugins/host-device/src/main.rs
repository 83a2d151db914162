fn main() {
    libcni::skel::run(&host_device::HostDevice)
}
