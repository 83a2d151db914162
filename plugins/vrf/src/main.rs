fn main() {
    libcni::skel::run(&vrf::Vrf)
}
