fn main() -> std::process::ExitCode {
    taskledger::server::main()
}
