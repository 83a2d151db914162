//! cnitool: see the library for the commands; this only wires the process to it.

fn main() {
    let args: Vec<String> = std::env::args_os().skip(1).map(|a| a.to_string_lossy().into_owned()).collect();
    let code = cnitool::run(&args, &cnitool::ProcessEnv, &mut std::io::stdout().lock(), &mut std::io::stderr().lock());
    std::process::exit(code)
}
