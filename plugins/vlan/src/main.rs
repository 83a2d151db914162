fn main() {
    libcni::skel::run(&vlan::Vlan)
}
