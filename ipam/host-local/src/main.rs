fn main() {
    libcni::skel::run(&host_local::HostLocal)
}
