fn main() {
    libcni::skel::run(&static_ipam::Static)
}
