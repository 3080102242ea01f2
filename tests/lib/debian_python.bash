# Sourced by the test scripts: debian_python DIR makes every python3 the script starts
# Debian's, which ./test.sh installs with matplotlib, through a link in DIR put first on the
# PATH. The one first on the PATH may be another (a pyenv shim takes 0.5 s to start; its
# interpreter may lack matplotlib).
debian_python() {
    [ -x /usr/bin/python3 ] || return 0
    mkdir "$1/bin" && ln -s /usr/bin/python3 "$1/bin/python3" && PATH=$1/bin:$PATH
}
