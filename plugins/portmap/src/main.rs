fn main() {
    libcni::skel::run(&portmap::PortMap)
}
